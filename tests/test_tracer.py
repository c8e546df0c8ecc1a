"""The tracer on real models through the library API: exact shapes, edges and parameter counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import fixture_models as fm
import pytest
import torch
from graph_checks import assert_clean, by_name, sources_of, types
from helpers import load_example
from torch import nn

from neurarch_trace import read_graph, trace_model, write_graph
from neurarch_trace.errors import GraphError, TraceError

ROOT = Path(__file__).resolve().parents[1]


def module_params(model: nn.Module, qualname: str) -> int:
    return sum(p.numel() for p in model.get_submodule(qualname).parameters())


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    model = load_example("resnet").ResNet18()
    graph = trace_model(model, torch.randn(1, 3, 224, 224))
    return model, graph


def test_resnet18_layer_counts_and_shapes(resnet18):
    model, graph = resnet18
    assert_clean(graph)
    assert types(graph) == Counter(
        {"conv2d": 20, "batchNorm": 20, "relu": 17, "add": 8, "maxpool2d": 1, "globalAvgPool2d": 1,
         "linear": 1, "input": 1, "output": 1}
    )
    comps = by_name(graph)
    assert comps["x"]["outputShape"] == [3, 224, 224]
    assert comps["output"]["inputShape"] == [1000]
    assert comps["conv1"]["outputShape"] == [64, 112, 112]
    assert comps["maxpool"]["outputShape"] == [64, 56, 56]
    assert comps["layer4.1.conv2"]["outputShape"] == [512, 7, 7]
    assert comps["avgpool"]["outputShape"] == [512, 1, 1]
    assert comps["fc"]["inputShape"] == [512]
    assert comps["conv1"]["params"] == {"inChannels": 3, "outChannels": 64, "kernelSize": 7, "stride": 2,
                                        "padding": 3, "bias": False}
    assert comps["maxpool"]["params"] == {"kernelSize": 3, "stride": 2, "padding": 1}
    assert comps["fc"]["params"] == {"inFeatures": 512, "outFeatures": 1000}
    assert comps["layer1.0.conv1"]["scope"] == "layer1.0"
    assert "scope" not in comps["conv1"]


def test_resnet18_residual_adds(resnet18):
    _, graph = resnet18
    adds = [c for c in graph["components"] if c["type"] == "add"]
    assert [c["name"] for c in adds] == [
        "layer1.0.add", "layer1.1.add", "layer2.0.add", "layer2.1.add",
        "layer3.0.add", "layer3.1.add", "layer4.0.add", "layer4.1.add",
    ]
    assert all(len(c["inputs"]) == 2 for c in adds)
    # an identity shortcut: the block's bn2 and the previous block's output relu
    assert sources_of(graph, "layer1.1.add") == ["layer1.1.bn2", "layer1.0.relu#2"]
    # a projection shortcut: bn2 and the downsample's BatchNorm
    assert sources_of(graph, "layer2.0.add") == ["layer2.0.bn2", "layer2.0.downsample.1"]
    assert sources_of(graph, "layer2.0.downsample.0") == ["layer1.1.relu#2"]
    assert sources_of(graph, "layer1.0.relu#2") == ["layer1.0.add"]


def test_resnet18_parameters_match_pytorch(resnet18):
    model, graph = resnet18
    total = sum(p.numel() for p in model.parameters())
    assert total == 11_689_512
    assert graph["measured"]["params"] == total
    per_node = 0
    for comp in graph["components"]:
        if comp["type"] in ("input", "output", "add"):
            continue
        qual = comp["name"].split("#")[0]
        owned = comp["measured"]["params"]
        if "#" in comp["name"]:  # a second call owns nothing
            assert owned == 0
        else:
            assert owned == module_params(model, qual), comp["name"]
        per_node += owned
    assert per_node == total
    # FLOPs: 1.814 GMACs for ResNet-18 at 224 px, the commonly quoted figure, = 2 FLOPs per MAC
    assert graph["measured"]["flops"] == 3_628_146_688


def test_tiny_gpt_tied_head_and_attention_flops():
    gpt = load_example("gpt")
    model = gpt.TinyGPT()
    graph = trace_model(model, torch.randint(0, 8192, (1, 64)))
    assert_clean(graph)
    comps = by_name(graph)
    assert comps["lm_head"]["type"] == "lmHead"
    assert comps["lm_head"]["params"] == {"embedDim": 256, "vocabSize": 8192, "bias": False, "weightTied": True}
    assert comps["lm_head"]["measured"]["params"] == 0
    assert comps["wte"]["measured"]["params"] == 8192 * 256
    assert graph["measured"]["params"] == sum(p.numel() for p in model.parameters()) == 5_322_240
    assert sources_of(graph, "add") == ["wte", "wpe"]
    assert sources_of(graph, "blocks.0.add") == ["drop", "blocks.0.attn.resid_dropout"]
    assert sources_of(graph, "blocks.0.add#2") == ["blocks.0.add", "blocks.0.mlp.dropout"]
    # position ids come from torch.arange: no batch axis, and a synthetic edge from the input
    assert comps["wpe"]["inputShape"] == [64]
    assert comps["wpe"]["outputShape"] == [64, 256]
    # SDPA in the attention container's forward: 4*B*H*T*T*head_dim per layer, 4 layers
    assert graph["measured"]["functionalFlops"] == 4 * (4 * 1 * 4 * 64 * 64 * 64)


def test_lstm_and_gru_tuple_outputs():
    model = fm.LSTMTagger()
    graph = trace_model(model, torch.randint(0, 500, (2, 7)))
    assert_clean(graph)
    lstm = by_name(graph)["lstm"]
    assert lstm["params"] == {"inputSize": 32, "hiddenSize": 48, "numLayers": 2, "bidirectional": True}
    assert lstm["inputShape"] == [7, 32]
    assert lstm["outputShape"] == [7, 96]
    assert lstm["measured"]["outputShapes"] == [[7, 96], [4, 48], [4, 48]]  # output, h_n, c_n
    assert lstm["measured"]["params"] == sum(p.numel() for p in model.lstm.parameters())
    assert sources_of(graph, "classifier") == ["lstm"]

    gru = fm.GRUEncoder()
    graph = trace_model(gru, torch.randn(7, 3, 16))  # sequence first: (L=7, N=3, H=16)
    assert_clean(graph)
    node = by_name(graph)["gru"]
    assert node["inputShape"] == [7, 16]
    assert node["measured"]["outputShapes"] == [[7, 24], [1, 24]]
    assert graph["measured"]["batchSize"] == 3
    assert by_name(graph)["output"]["measured"]["outputShapes"] == [[7, 24], [1, 24]]


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_one_node(batch_first):
    model = fm.AttentionBlock(batch_first=batch_first)
    x = torch.randn(2, 5, 32) if batch_first else torch.randn(5, 2, 32)
    graph = trace_model(model, x)
    assert_clean(graph)
    assert types(graph) == Counter({"input": 1, "multiHeadAttention": 1, "add": 1, "layerNorm": 1, "output": 1})
    attn = by_name(graph)["attn"]
    assert attn["params"] == {"hiddenDim": 32, "numHeads": 4}
    assert attn["inputShape"] == attn["outputShape"] == [5, 32]
    assert attn["measured"]["outputShapes"] == [[5, 32], [5, 5]]
    assert attn["measured"]["params"] == 4 * 32 * 32 + 4 * 32
    assert sources_of(graph, "add") == ["x", "attn"]
    assert by_name(graph)["add"]["outputShape"] == [5, 32]


def test_module_called_twice_is_two_nodes():
    graph = trace_model(fm.CalledTwice(), torch.randn(1, 16))
    assert_clean(graph)
    assert [c["name"] for c in graph["components"]] == ["x", "fc", "act", "fc#2", "output"]
    comps = by_name(graph)
    assert comps["fc"]["measured"]["params"] == 16 * 16 + 16
    assert comps["fc#2"]["measured"]["params"] == 0
    assert comps["fc#2"]["measured"]["sharedWith"] == comps["fc"]["id"]
    assert sources_of(graph, "fc#2") == ["act"]


def test_names_of_modules_called_outside_their_parent():
    """A module called from another block's forward keeps its own path; with one module under two
    parents, each call is named by the parent it runs under."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, other: nn.Module) -> torch.Tensor:
            return other(self.fc(x))  # a sibling's child, called in this block's scope

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Block(), Block()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x, self.b.fc), nn.Identity())

    names = [c["name"] for c in trace_model(Net(), torch.randn(2, 4))["components"]]
    assert names == ["x", "a.fc", "b.fc", "b.fc#2", "output"]
    shared = fm.SharedParents()
    assert [c["name"] for c in trace_model(shared, torch.randn(1, 8))["components"]] == \
        ["x", "enc.0", "enc.1", "dec.0", "dec.1", "output"]


def test_inplace_residual_becomes_add():
    graph = trace_model(fm.InplaceResidual(), torch.randn(1, 8))
    assert_clean(graph)
    assert sources_of(graph, "add") == ["fc1", "x"]
    assert sources_of(graph, "fc2") == ["add"]


def test_cat_and_stack_merges():
    graph = trace_model(fm.CatStack(), torch.randn(1, 8))
    assert_clean(graph)
    comps = by_name(graph)
    assert comps["cat"]["type"] == "concatenate"
    assert sources_of(graph, "cat") == ["a", "b"]
    assert comps["cat"]["outputShape"] == [10]
    assert comps["stack"]["type"] == "stack"
    assert sources_of(graph, "stack") == ["h1", "h2"]
    assert comps["stack"]["outputShape"] == [2, 3]
    assert sources_of(graph, "h1") == ["cat"] and sources_of(graph, "h2") == ["cat"]


def test_dict_output_reaches_the_output_node():
    graph = trace_model(fm.DictOutput(), torch.randn(1, 8))
    assert_clean(graph)
    out = by_name(graph)["output"]
    assert sources_of(graph, "output") == ["head", "body"]
    assert out["inputShape"] == [3]
    assert out["measured"]["outputShapes"] == [[3], [8]]


def test_two_input_forward():
    graph = trace_model(fm.TwoInput(), (torch.randn(1, 3, 8, 8), torch.randn(1, 5)))
    assert_clean(graph)
    inputs = [c for c in graph["components"] if c["type"] == "input"]
    # the forward's argument `meta` shares its name with the layer `self.meta`: the layer keeps it
    assert [c["name"] for c in inputs] == ["image", "input:meta"]
    assert [c["outputShape"] for c in inputs] == [[3, 8, 8], [5]]
    assert sources_of(graph, "meta") == ["input:meta"]
    assert sources_of(graph, "cat") == ["flat", "meta"]
    assert sources_of(graph, "head") == ["cat"]


def test_integer_path_and_integer_output():
    graph = trace_model(fm.IntegerPath(), torch.randint(0, 50, (1, 5)))
    assert_clean(graph)
    assert sources_of(graph, "emb") == ["ids"]
    assert by_name(graph)["output"]["inputShape"] == [5]
    assert by_name(graph)["fc"]["measured"]["outputDtype"] == "float32"
    assert graph["measured"]["inputs"] == [{"name": "ids", "shape": [1, 5], "dtype": "int64"}]


def test_unknown_leaf_is_custom_module():
    graph = trace_model(fm.WithUnknownLeaf(), torch.randn(1, 6))
    assert_clean(graph)
    assert by_name(graph)["scale"]["type"] == "customModule"
    assert by_name(graph)["scale"]["params"] == {"className": "Scale", "paramCount": 6}


def test_depth_cuts_containers():
    model = fm.Deep()
    g1 = trace_model(model, torch.randn(1, 8), depth=1)
    assert_clean(g1)
    assert [c["name"] for c in g1["components"]] == ["x", "stem", "stage", "head", "output"]
    stage = by_name(g1)["stage"]
    assert stage["type"] == "customModule"
    assert stage["params"] == {"className": "Sequential", "paramCount": 2 * (16 * 16 + 16)}
    assert stage["measured"]["flops"] == 2 * 2 * 16 * 16
    g2 = trace_model(model, torch.randn(1, 8), depth=2)
    assert_clean(g2)
    assert [c["name"] for c in g2["components"]] == ["x", "stem", "stage.0", "stage.1", "head", "output"]
    g_full = trace_model(model, torch.randn(1, 8))
    assert [c["name"] for c in g_full["components"]] == [
        "x", "stem", "stage.0.0", "stage.0.1", "stage.1.0", "stage.1.1", "head", "output"]
    assert g1["measured"]["flops"] == g2["measured"]["flops"] == g_full["measured"]["flops"]


def test_depth_is_an_int_or_refused_by_type():
    import numpy as np

    model = fm.Deep()
    x = torch.randn(1, 8)
    names = [c["name"] for c in trace_model(model, x, depth=1, training_step=False)["components"]]
    assert [c["name"] for c in trace_model(model, x, depth=np.int64(1), training_step=False)["components"]] == names
    for bad, kind in (("1", "str"), (1.0, "float"), (True, "bool")):
        with pytest.raises(TypeError) as info:
            trace_model(model, x, depth=bad)
        assert str(info.value) == f"depth must be an int or None, not {kind}"
    with pytest.raises(ValueError, match="^depth must be 0 or more, not -1$"):
        trace_model(model, x, depth=-1)


def test_training_step_is_a_flag_not_any_truthy_value():
    import numpy as np

    model = nn.Linear(4, 3)
    for bad in ("no", "False", None, 2):  # "no" is truthy: it must not run the step it asks to leave out
        with pytest.raises(TypeError) as info:
            trace_model(model, torch.randn(1, 4), training_step=bad)
        assert str(info.value) == f"training_step must be True or False, not {bad!r}"
    for off in (False, 0, np.bool_(False)):
        assert "training" not in trace_model(model, torch.randn(1, 4), training_step=off)["measured"]
    assert "training" in trace_model(model, torch.randn(1, 4), training_step=np.bool_(True))["measured"]


def test_a_batch_of_0_samples_is_refused_as_the_command_line_refuses_it():
    model = nn.Linear(4, 3)
    with pytest.raises(ValueError) as info:
        trace_model(model, torch.randn(0, 4))
    assert str(info.value) == ("input 'input' of shape (0, 4) holds a batch of 0 samples: give at least one, "
                               "e.g. shape (1, ...)")
    with pytest.raises(ValueError, match="holds a batch of 0 samples"):
        trace_model(model, {"input": torch.randn(0, 4)})
    assert trace_model(model, torch.randn(1, 4), training_step=False)["measured"]["batchSize"] == 1


def test_a_module_without_forward_is_told_so():
    from neurarch_trace.errors import TraceError

    class NoForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = NoForward()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    for model, where in ((NoForward(), "after 0 layers"), (Outer(), "in 'inner' after 0 layers")):
        with pytest.raises(TraceError) as info:
            trace_model(model, torch.randn(1, 4))
        assert str(info.value) == (
            f"the forward pass failed {where}: NotImplementedError: Module [NoForward] is missing the required "
            '"forward" function; define forward(self, ...) in that class (nn.Module has none of its own)')


def test_a_cut_node_owns_what_it_calls_from_elsewhere():
    """At ``--depth 1`` a block whose forward calls another block's layer uses that layer's weights:
    its node owns them (nobody did before), so the nodes' parameters add up to the model's and
    none are unused; at full depth the layer is its own node under the caller's scope."""

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, helper: nn.Module) -> torch.Tensor:
            return helper(self.fc(x))

    class CrossCall(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.b1, self.b2 = Inner(), Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b1(x, self.b2.fc)

    model = CrossCall()
    total = sum(p.numel() for p in model.parameters())
    assert total == 2 * (8 * 8 + 8)
    for depth in (None, 1):
        graph = trace_model(model, torch.randn(3, 8), depth=depth, training_step=False)
        assert graph["measured"]["params"] == total and graph["measured"]["unusedParams"] == 0, depth
        assert sum(c["measured"].get("params", 0) for c in graph["components"]) == total, depth
    comps = by_name(graph)
    assert comps["b1"]["measured"]["params"] == total and comps["b1"]["params"]["paramCount"] == total
    assert comps["b1"]["measured"]["flops"] == 2 * 2 * 3 * 8 * 8  # both linears, 3 rows each


def test_depth_names_what_a_container_is():
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = nn.Sequential(layer)
    graph = trace_model(model, torch.randn(1, 6, 32), depth=1)
    assert by_name(graph)["0"]["type"] == "transformerBlock"
    assert by_name(graph)["0"]["params"] == {"embedDim": 32, "numHeads": 4, "ffDim": 64}


def test_training_flag_restored_and_hooks_removed():
    model = fm.CalledTwice().train()
    trace_model(model, torch.randn(1, 16))
    assert model.training and model.fc.training
    assert not model.fc._forward_hooks and not model.fc._forward_pre_hooks


def test_failing_forward_says_where():
    model = fm.TwoInput()
    with pytest.raises(TraceError) as info:
        trace_model(model, (torch.randn(1, 4, 8, 8), torch.randn(1, 5)))
    text = str(info.value)
    assert "in layer 'conv' (Conv2d)" in text and "RuntimeError" in text and "\n" not in text
    assert isinstance(info.value.__cause__, RuntimeError)
    # the failure inside a layer left no mode behind, no hook, and the model's flags as they were
    assert torch._C._len_torch_function_stack() == 0
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()
    assert not model.conv._forward_hooks and not model.conv._forward_pre_hooks
    graph = trace_model(model, (torch.randn(1, 3, 8, 8), torch.randn(1, 5)))
    assert_clean(graph)


def test_write_and_read_back(tmp_path):
    graph = trace_model(fm.CatStack(), torch.randn(1, 8))
    path = tmp_path / "g.neurarch.json"
    write_graph(graph, path)
    assert read_graph(path, strict=True) == json.loads(json.dumps(graph))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GraphError, match="is not JSON"):
        read_graph(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(GraphError, match="not a JSON object"):
        read_graph(tmp_path / "list.json")
    broken = json.loads(json.dumps(graph))
    broken["connections"].append({"id": "x", "from": "n1", "to": "nope", "fromPort": "bottom", "toPort": "top"})
    with pytest.raises(GraphError, match="does not exist"):
        write_graph(broken, tmp_path / "broken.neurarch.json")
    assert not (tmp_path / "broken.neurarch.json").exists()


def test_deterministic():
    a = trace_model(fm.TinyViT(), torch.randn(1, 3, 32, 32))
    b = trace_model(fm.TinyViT(), torch.randn(1, 3, 32, 32))
    assert json.dumps(a) == json.dumps(b)


def test_depth_types_only_what_it_knows():
    # issue 16.3: "TinyEffNet" contains "ffn" and "SeparableConvBlock" starts with "se" and ends with
    # "block"; neither is a feed-forward or a squeeze-excitation block, and no class name is read
    class SeparableConvBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.pointwise = nn.Conv2d(8, 16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pointwise(self.depthwise(x))

    class MyAttention(nn.Module):  # a user's class named like an attention is not typed by its name
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(16, 48)
            self.num_heads = 4

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, -1)
            return torch.softmax(q @ k.mT, -1) @ v

    class TinyEffNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.block = SeparableConvBlock()
            self.attn = MyAttention()
            self.head = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            tokens = self.block(self.stem(x)).flatten(2).transpose(1, 2)
            return self.head(self.attn(tokens).mean(1))

    model = TinyEffNet()
    whole = trace_model(model, torch.randn(1, 3, 8, 8), depth=0)
    root = by_name(whole)["TinyEffNet"]
    assert root["type"] == "customModule"
    assert root["params"] == {"className": "TinyEffNet", "paramCount": sum(p.numel() for p in model.parameters())}
    d1 = by_name(trace_model(model, torch.randn(1, 3, 8, 8), depth=1))
    assert d1["block"]["params"] == {"className": "SeparableConvBlock", "paramCount": 8 * 9 + 8 + 8 * 16 + 16}
    assert d1["attn"]["type"] == "customModule"
    assert d1["stem"]["type"] == "conv2d" and d1["head"]["type"] == "linear"
    full = by_name(trace_model(model, torch.randn(1, 3, 8, 8)))
    assert full["block.depthwise"]["type"] == "depthwiseConv2d"
    # a conv whose stride equals a kernel above 4 on three channels is still a conv (no patchEmbed guess)
    patch = by_name(trace_model(nn.Sequential(nn.Conv2d(3, 8, 8, stride=8)), torch.randn(1, 3, 32, 32)))
    assert patch["0"]["type"] == "conv2d"


def test_depth_types_transformers_containers_by_exact_class():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=8)
    model = transformers.ViTModel(cfg)
    comps = by_name(trace_model(model, torch.randn(1, 3, 16, 16), depth=2))
    assert comps["embeddings.patch_embeddings"]["type"] == "patchEmbed"
    assert comps["embeddings.patch_embeddings"]["params"] == {"patchSize": 8, "embedDim": 32, "inChans": 3}
    assert comps["layers.0"]["type"] == "transformerBlock"  # ViTLayer
    assert comps["layers.0"]["params"] == {"embedDim": 32, "numHeads": 2, "ffDim": 64}
    comps = by_name(trace_model(model, torch.randn(1, 3, 16, 16), depth=3))
    assert comps["layers.0.attention"]["type"] == "attention"  # ViTAttention
    assert comps["layers.0.attention"]["params"] == {"embedDim": 32, "numHeads": 2}
    assert comps["layers.0.mlp"]["type"] == "feedForward"  # ViTMLP
