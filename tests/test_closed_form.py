"""The fast path against the reference path: closed-form FLOPs of leaf layers, no autograd, the FLOP
mode only where it is needed.

The reference path (``reference_path()``) is the tracer as it was: every aten call through the
FLOP-counting dispatch mode, the forward with autograd on. Every graph the fast path writes must be
the same document, node for node and edge for edge: here per layer type on many shapes,
hyperparameters, batch sizes, dtypes and grad modes, and on whole models (the fixtures, the
examples and the transformers sweep of ``test_architectures.py``).
"""

from __future__ import annotations

import contextlib
import warnings

import fixture_models as fm
import pytest
import torch
from helpers import load_example

try:
    from test_architectures import CASES as ARCHITECTURES
except pytest.skip.Exception:  # no transformers
    ARCHITECTURES = {}
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.trace.closed_form import closed_form, formula_for, reference_path


def both(model: nn.Module, inputs, **kwargs) -> tuple[dict, dict]:
    """The graph of the fast path and that of the reference path, from the same weights. Without the
    training-step rehearsal, which the fast paths do not touch (it runs under its own modes), but for
    the one fixture that checks the rehearsed step is the same on both paths."""
    kwargs.setdefault("training_step", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = trace_model(model, inputs, **kwargs)
        with reference_path():
            reference = trace_model(model, inputs, **kwargs)
    return fast, reference


def assert_same(model: nn.Module, inputs, **kwargs) -> dict:
    fast, reference = both(model, inputs, **kwargs)
    fast_nodes = {c["name"]: c["measured"].get("flops") for c in fast["components"]}
    reference_nodes = {c["name"]: c["measured"].get("flops") for c in reference["components"]}
    assert fast_nodes == reference_nodes  # FLOPs per node first: the clearest message
    assert fast["connections"] == reference["connections"]
    assert fast == reference
    return fast


class Under(nn.Module):
    """Calls ``layer`` inside a grad-mode context of the model's own forward."""

    def __init__(self, layer: nn.Module, mode: str) -> None:
        super().__init__()
        self.layer = layer
        self.mode = mode

    def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        context = {"plain": contextlib.nullcontext, "no_grad": torch.no_grad,
                   "inference_mode": torch.inference_mode}[self.mode]
        with context():
            return self.layer(*args, **kwargs)


GRAD_MODES = ["plain", "no_grad", "inference_mode"]


def check_layer(layer: nn.Module, x: torch.Tensor, mode: str = "plain", **kwargs) -> dict:
    """The layer alone, called in a grad-mode context of the model's forward; returns its node."""
    model = Under(layer, mode)
    graph = assert_same(model, x, kwargs=kwargs or None)
    node = next(c for c in graph["components"] if c["type"] not in ("input", "output"))
    return node


# --- linear ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 7, 5), (2, 3, 4, 5), (1, 1, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(mode, shape, bias):
    node = check_layer(nn.Linear(5, 6, bias=bias), torch.randn(*shape), mode)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    assert node["measured"]["flops"] == 2 * rows * 5 * 6


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_linear_dtypes_and_a_transposed_input(dtype):
    check_layer(nn.Linear(8, 3).to(dtype), torch.randn(2, 4, 8).to(dtype))

    class Transposed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):  # noqa: ANN001, ANN201
            return self.fc(x.transpose(1, 2))  # a non-contiguous 3-D input

    graph = assert_same(Transposed(), torch.randn(2, 4, 6))
    assert graph["measured"]["flops"] == 2 * 2 * 6 * 4 * 3


# --- convolutions ---------------------------------------------------------------------------

CONVS = [
    (nn.Conv1d, dict(in_channels=4, out_channels=6, kernel_size=3), (2, 4, 17)),
    (nn.Conv1d, dict(in_channels=4, out_channels=8, kernel_size=5, stride=2, padding=2, dilation=2, groups=2),
     (1, 4, 30)),
    (nn.Conv1d, dict(in_channels=4, out_channels=4, kernel_size=3, padding="same", padding_mode="reflect"),
     (3, 4, 9)),
    (nn.Conv2d, dict(in_channels=3, out_channels=8, kernel_size=3, padding=1), (2, 3, 16, 16)),
    (nn.Conv2d, dict(in_channels=3, out_channels=16, kernel_size=8, stride=8), (1, 3, 32, 32)),  # a patch embed
    (nn.Conv2d, dict(in_channels=8, out_channels=8, kernel_size=7, padding=3, groups=8), (2, 8, 14, 14)),
    (nn.Conv2d, dict(in_channels=8, out_channels=16, kernel_size=3, stride=(2, 1), padding=(1, 2),
                     dilation=(1, 2), groups=4, bias=False), (3, 8, 13, 11)),
    (nn.Conv2d, dict(in_channels=2, out_channels=3, kernel_size=(3, 5), padding="valid"), (1, 2, 9, 9)),
    (nn.Conv2d, dict(in_channels=2, out_channels=3, kernel_size=3, padding=1, padding_mode="circular"),
     (2, 2, 6, 6)),
    (nn.Conv3d, dict(in_channels=2, out_channels=4, kernel_size=3, stride=2, padding=1), (1, 2, 8, 8, 8)),
    (nn.Conv3d, dict(in_channels=4, out_channels=4, kernel_size=(1, 3, 3), groups=2, padding_mode="replicate",
                     padding=1), (2, 4, 3, 6, 6)),
    (nn.ConvTranspose1d, dict(in_channels=4, out_channels=2, kernel_size=4, stride=2, padding=1), (2, 4, 10)),
    (nn.ConvTranspose2d, dict(in_channels=6, out_channels=4, kernel_size=3, stride=2, padding=1,
                              output_padding=1, groups=2, dilation=1), (1, 6, 7, 7)),
    (nn.ConvTranspose2d, dict(in_channels=4, out_channels=4, kernel_size=2, stride=2, bias=False), (3, 4, 5, 5)),
    (nn.ConvTranspose3d, dict(in_channels=2, out_channels=3, kernel_size=3, stride=2, dilation=2),
     (1, 2, 4, 4, 4)),
]


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_convolutions(case, mode):
    cls, kwargs, shape = CONVS[case]
    torch.manual_seed(case)
    layer = cls(**kwargs)
    node = check_layer(layer, torch.randn(*shape), mode)
    out = layer(torch.randn(*shape))
    weight = layer.weight.shape
    batch = shape[0]
    if cls.__name__.startswith("ConvTranspose"):
        # every input position meets the whole filter: in x (out/groups) x prod(kernel)
        positions = torch.Size(shape[2:]).numel()
        expected = 2 * batch * positions * weight.numel()
    else:
        positions = torch.Size(out.shape[2:]).numel()
        expected = 2 * batch * positions * weight.numel()
    assert node["measured"]["flops"] == expected


def test_transposed_convolution_with_output_size_and_dtypes():
    layer = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1)
    check_layer(layer, torch.randn(1, 3, 5, 5), output_size=[10, 10])
    check_layer(nn.Conv2d(3, 4, 3).double(), torch.randn(2, 3, 8, 8, dtype=torch.float64))
    check_layer(nn.Conv2d(3, 4, 3).bfloat16(), torch.randn(2, 3, 8, 8).bfloat16())


def test_unbatched_convolution_and_complex_inputs_take_the_reference_count():
    # an unbatched input reaches aten.convolution batched (and aten.conv2d under inference_mode
    # unbatched): the closed form stands aside and the dispatch count is kept as it is
    for mode in GRAD_MODES:
        check_layer(nn.Conv2d(3, 4, 3), torch.randn(3, 9, 9), mode)
    conv = nn.Conv2d(3, 4, 3)
    assert closed_form(conv, (torch.randn(3, 9, 9),), {}) is None
    fc = nn.Linear(4, 2, dtype=torch.complex64)
    assert closed_form(fc, (torch.randn(1, 4, dtype=torch.complex64),), {}) is None
    node = check_layer(fc, torch.randn(1, 4, dtype=torch.complex64))
    assert node["measured"]["flops"] == 4 * 2 * 4 * 2


# --- layers of 0 FLOPs ----------------------------------------------------------------------

ZERO = [
    (nn.BatchNorm1d(6), (4, 6)), (nn.BatchNorm1d(6), (2, 6, 5)), (nn.BatchNorm2d(3), (2, 3, 4, 4)),
    (nn.BatchNorm3d(2), (1, 2, 3, 3, 3)), (nn.LayerNorm(8), (2, 5, 8)), (nn.LayerNorm([4, 8], bias=False), (2, 4, 8)),
    (nn.GroupNorm(2, 6), (2, 6, 5, 5)), (nn.InstanceNorm2d(3, affine=True), (2, 3, 6, 6)),
    (nn.InstanceNorm1d(3), (2, 3, 6)), (nn.RMSNorm(8), (2, 3, 8)), (nn.LocalResponseNorm(2), (1, 4, 5, 5)),
    (nn.ReLU(), (3, 7)), (nn.ReLU(inplace=True), (3, 7)), (nn.ReLU6(), (2, 4)), (nn.LeakyReLU(0.2), (2, 4)),
    (nn.PReLU(4), (2, 4, 3)), (nn.RReLU(), (2, 4)), (nn.ELU(), (2, 4)), (nn.CELU(), (2, 4)), (nn.SELU(), (2, 4)),
    (nn.GELU(), (2, 4)), (nn.GELU(approximate="tanh"), (2, 4)), (nn.SiLU(), (2, 4)), (nn.Mish(), (2, 4)),
    (nn.Hardswish(), (2, 4)), (nn.Hardsigmoid(), (2, 4)), (nn.Hardtanh(), (2, 4)), (nn.Hardshrink(), (2, 4)),
    (nn.Softshrink(), (2, 4)), (nn.Tanhshrink(), (2, 4)), (nn.Threshold(0.1, 0.0), (2, 4)),
    (nn.Sigmoid(), (2, 4)), (nn.LogSigmoid(), (2, 4)), (nn.Tanh(), (2, 4)), (nn.Softplus(), (2, 4)),
    (nn.Softsign(), (2, 4)), (nn.GLU(), (2, 4)), (nn.Softmax(dim=-1), (2, 4)), (nn.Softmin(dim=1), (2, 4)),
    (nn.LogSoftmax(dim=-1), (2, 3, 4)), (nn.Softmax2d(), (1, 3, 4, 4)),
    (nn.MaxPool1d(2), (2, 3, 8)), (nn.MaxPool2d(3, 2, 1), (2, 3, 9, 9)), (nn.MaxPool2d(2, return_indices=True),
                                                                         (1, 2, 4, 4)),
    (nn.MaxPool3d(2), (1, 1, 4, 4, 4)), (nn.AvgPool1d(3), (2, 3, 9)), (nn.AvgPool2d(2, ceil_mode=True), (1, 3, 5, 5)),
    (nn.AvgPool3d(2), (1, 1, 4, 4, 4)), (nn.AdaptiveAvgPool1d(3), (2, 3, 9)), (nn.AdaptiveAvgPool2d(1), (2, 3, 5, 5)),
    (nn.AdaptiveAvgPool2d((2, 3)), (2, 3, 7, 7)), (nn.AdaptiveAvgPool3d(1), (1, 2, 3, 3, 3)),
    (nn.AdaptiveMaxPool1d(2), (2, 3, 8)), (nn.AdaptiveMaxPool2d(2), (2, 3, 8, 8)),
    (nn.AdaptiveMaxPool3d(1), (1, 2, 3, 3, 3)), (nn.LPPool1d(2, 2), (2, 3, 8)), (nn.LPPool2d(2, 2), (1, 3, 8, 8)),
    (nn.Dropout(0.3), (2, 5)), (nn.Dropout1d(), (2, 3, 5)), (nn.Dropout2d(), (2, 3, 4, 4)),
    (nn.Dropout3d(), (1, 2, 3, 3, 3)), (nn.AlphaDropout(), (2, 5)), (nn.FeatureAlphaDropout(), (2, 3, 4)),
    (nn.Flatten(), (2, 3, 4)), (nn.Unflatten(1, (2, 3)), (2, 6)), (nn.ZeroPad2d(1), (1, 2, 3, 3)),
    (nn.ConstantPad1d(2, 0.5), (2, 3, 4)), (nn.ReflectionPad2d(1), (1, 2, 3, 3)),
    (nn.ReplicationPad3d(1), (1, 1, 2, 2, 2)), (nn.CircularPad1d(1), (1, 2, 4)), (nn.PixelShuffle(2), (1, 8, 3, 3)),
    (nn.PixelUnshuffle(2), (1, 2, 4, 4)), (nn.ChannelShuffle(2), (1, 4, 3, 3)),
]


@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("case", range(len(ZERO)))
def test_layers_of_zero_flops(case, mode):
    layer, shape = ZERO[case]
    node = check_layer(layer, torch.randn(*shape), mode)
    assert node["measured"]["flops"] == 0
    assert formula_for(type(layer)) is not None


@pytest.mark.parametrize("mode", GRAD_MODES)
def test_embeddings(mode):
    ids = torch.randint(0, 50, (3, 7))
    check_layer(nn.Embedding(50, 8), ids, mode)
    check_layer(nn.Embedding(50, 8, padding_idx=0, max_norm=1.0), ids, mode)
    check_layer(nn.EmbeddingBag(50, 8, mode="mean"), ids, mode)
    check_layer(nn.EmbeddingBag(50, 8, mode="sum"), ids, mode, per_sample_weights=torch.rand(3, 7))


def test_known_layers_run_without_the_dispatch_mode(monkeypatch):
    from neurarch_trace.flops import FlopMode

    seen: list[str] = []
    original = FlopMode.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
        seen.append(str(func._overloadpacket))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(FlopMode, "__torch_dispatch__", spy)
    model, x = load_example("resnet").ResNet18(), torch.randn(1, 3, 32, 32)
    with reference_path():
        trace_model(model, x)
    assert seen.count("aten.convolution") == 20 and seen.count("aten.addmm") == 1
    seen.clear()
    trace_model(model, x)
    # the functional code between layers (8 residual adds, the flatten before fc) costs 0 FLOPs
    # whatever the shapes: the FLOP mode steps aside for it too
    assert seen == []
    # attention between layers still goes through it
    trace_model(load_example("gpt").TinyGPT(), torch.randint(0, 100, (1, 16)))
    assert seen == ["aten._scaled_dot_product_flash_attention_for_cpu"] * 4


def test_a_transformers_subclass_of_a_torch_layer_with_its_own_forward(monkeypatch):
    """ConvNeXt's layer norm is nn.LayerNorm with permutes around it for channels-first input: a
    forward of its own, so not nn.LayerNorm's formula, but transformers' table's (0 FLOPs), and its
    ops run without the dispatch mode; the graph is the reference path's."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm

    from neurarch_trace.flops import FlopMode

    assert formula_for(ConvNextLayerNorm) is not None
    for data_format, shape in (("channels_first", (2, 8, 5, 5)), ("channels_last", (2, 5, 5, 8))):
        node = check_layer(ConvNextLayerNorm(8, data_format=data_format), torch.randn(*shape))
        assert node["measured"]["flops"] == 0 and node["measured"]["params"] == 16
    seen: list[str] = []
    original = FlopMode.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
        seen.append(str(func._overloadpacket))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(FlopMode, "__torch_dispatch__", spy)
    config = transformers.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
    torch.manual_seed(0)
    model = transformers.ConvNextModel(config).eval()
    trace_model(model, torch.randn(1, 3, 64, 64), training_step=False)
    assert seen == []  # was 7 aten.native_layer_norm and 2 aten.permute, inside the layer norms
    monkeypatch.undo()
    assert_same(model, torch.randn(1, 3, 64, 64))


# --- when the closed form stands aside --------------------------------------------------------


def test_subclasses_hooks_and_parametrizations_are_counted_op_by_op():
    from torch.nn.utils import parametrizations

    class Plain(nn.Linear):  # adds nothing but __init__: still a linear's forward
        def __init__(self) -> None:
            super().__init__(8, 8)

    class LowRank(nn.Linear):  # a forward of its own: the FLOPs are its own
        def __init__(self) -> None:
            super().__init__(8, 8)
            self.a = nn.Parameter(torch.randn(8, 2))
            self.b = nn.Parameter(torch.randn(2, 8))

        def forward(self, x):  # noqa: ANN001, ANN201
            return super().forward(x) + x @ self.a @ self.b

    x = torch.randn(3, 8)
    assert closed_form(_hooked(Plain()), (x,), {}) is not None
    assert formula_for(nn.modules.linear.NonDynamicallyQuantizableLinear) is not None
    assert formula_for(LowRank) is None
    node = check_layer(LowRank(), x)
    assert node["measured"]["flops"] == 2 * 3 * 8 * 8 + 2 * 3 * 8 * 2 + 2 * 3 * 2 * 8
    # an orthogonal parametrization computes the weight with matrix products in the forward
    ortho = parametrizations.orthogonal(nn.Linear(8, 8))
    assert formula_for(type(ortho)) is None
    check_layer(ortho, x)
    spectral = nn.utils.spectral_norm(nn.Linear(8, 8))  # a forward pre-hook doing power iteration
    assert closed_form(_hooked(spectral), (x,), {}) is None
    check_layer(spectral, x)
    seen = []
    hooked = nn.Linear(8, 8)
    hooked.register_forward_hook(lambda m, a, out: seen.append(out @ out.T))  # a user's hook does work
    assert closed_form(_hooked(hooked), (x,), {}) is None
    node = check_layer(hooked, x)
    assert node["measured"]["flops"] == 2 * 3 * 8 * 8 + 2 * 3 * 8 * 3


def test_tensor_subclass_weights_and_a_layer_under_another_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Logged(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN201
            return func(*args, **(kwargs or {}))

    class UnderMode(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):  # noqa: ANN001, ANN201
            with Logged():  # the FLOP mode is not on top: the layer must not be popped off
                return self.fc(x)

    graph = assert_same(UnderMode(), torch.randn(2, 4))
    assert graph["measured"]["flops"] == 2 * 2 * 4 * 4


def test_the_whole_trace_under_the_callers_inference_mode_and_on_meta():
    model = load_example("resnet").ResNet18()
    with torch.inference_mode():
        assert_same(model, torch.randn(1, 3, 32, 32))
    with torch.no_grad():
        assert_same(fm.TinyViT(), torch.randn(1, 3, 32, 32))
    with torch.device("meta"):
        meta = load_example("resnet").ResNet18()
    assert_same(meta, torch.randn(2, 3, 64, 64, device="meta"))


def test_a_forward_that_differentiates_runs_again_with_autograd():
    class Forces(nn.Module):
        """An energy model returning -dE/dx, as force fields do, without enabling grad itself."""

        def __init__(self) -> None:
            super().__init__()
            self.energy = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))

        def forward(self, x):  # noqa: ANN001, ANN201
            x = x.requires_grad_(True)
            e = self.energy(x).sum()
            (grad,) = torch.autograd.grad(e, x, create_graph=False)
            return -grad

    graph = assert_same(Forces(), torch.randn(5, 3))
    assert by_type(graph, "linear") == 2


def by_type(graph: dict, kind: str) -> int:
    return sum(c["type"] == kind for c in graph["components"])


def _hooked(module: nn.Module) -> nn.Module:
    """``module`` with the recorder's two hooks (what the trace adds), for :func:`closed_form`."""
    module.register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True)
    module.register_forward_hook(lambda m, a, k, o: None, with_kwargs=True)
    return module


# --- whole models -----------------------------------------------------------------------------

FIXTURES = {
    "LSTMTagger": (fm.LSTMTagger, lambda: torch.randint(0, 500, (2, 7))),
    "GRUEncoder": (fm.GRUEncoder, lambda: torch.randn(5, 2, 16)),
    "SeqFirstLSTM": (fm.SeqFirstLSTM, lambda: torch.randn(3, 6, 10)),
    "AttentionBlock": (fm.AttentionBlock, lambda: torch.randn(2, 5, 32)),
    "AttentionBlockSeqFirst": (lambda: fm.AttentionBlock(batch_first=False), lambda: torch.randn(5, 2, 32)),
    "CalledTwice": (fm.CalledTwice, lambda: torch.randn(2, 16)),
    "InplaceResidual": (fm.InplaceResidual, lambda: torch.randn(2, 8)),
    "CatStack": (fm.CatStack, lambda: torch.randn(2, 8)),
    "DictOutput": (fm.DictOutput, lambda: torch.randn(2, 8)),
    "TwoInput": (fm.TwoInput, lambda: (torch.randn(2, 3, 8, 8), torch.randn(2, 5))),
    "IntegerPath": (fm.IntegerPath, lambda: torch.randint(0, 50, (2, 6))),
    "SmallVocab": (fm.SmallVocab, lambda: torch.randint(0, 100, (2, 6))),
    "WithUnknownLeaf": (fm.WithUnknownLeaf, lambda: torch.randn(2, 6)),
    "Deep": (fm.Deep, lambda: torch.randn(2, 8)),
    "TinyViT": (fm.TinyViT, lambda: torch.randn(1, 3, 32, 32)),
    "GatedResidual": (fm.GatedResidual, lambda: torch.randn(1, 8)),
    "TiedLM": (fm.TiedLM, lambda: torch.randint(0, 64, (1, 5))),
    "SharedParents": (fm.SharedParents, lambda: torch.randn(1, 8)),
    "Containers": (fm.Containers, lambda: torch.randn(2, 8)),
    "PartlyNoGrad": (fm.PartlyNoGrad, lambda: torch.randn(1, 8)),
    "KwargsModel": (fm.KwargsModel, lambda: {"input_ids": torch.randint(0, 120, (2, 9)),
                                             "token_type_ids": torch.zeros(2, 9, dtype=torch.long),
                                             "attention_mask": torch.ones(2, 9, dtype=torch.long)}),
    "WithScripted": (fm.WithScripted, lambda: torch.randn(1, 8)),
    "ComplexLinear": (fm.ComplexLinear, lambda: torch.randn(1, 8, dtype=torch.complex64)),
    "TransformerSeqFirst": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0), 1,
                                                          enable_nested_tensor=False),
                            lambda: torch.randn(7, 3, 16)),
    "ResNet18": (lambda: load_example("resnet").ResNet18(), lambda: torch.randn(1, 3, 64, 64)),
    "ResNet50": (lambda: load_example("resnet").ResNet50(), lambda: torch.randn(2, 3, 64, 64)),
    "ViT_Tiny": (lambda: load_example("vit").ViT_Tiny(), lambda: torch.randn(1, 3, 32, 32)),
    "TinyGPT": (lambda: load_example("gpt").TinyGPT(), lambda: torch.randint(0, 8192, (1, 32))),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_and_example_graphs_are_the_reference_graphs(name):
    make_model, make_inputs = FIXTURES[name]
    torch.manual_seed(0)
    assert_same(make_model(), make_inputs(), training_step=name == "ResNet18")
    if name in ("Deep", "TinyViT", "ResNet18"):
        assert_same(make_model(), make_inputs(), depth=1)
        assert_same(make_model(), make_inputs(), depth=2)


# --- the recorder around a forward: a wrapper, or the hooks -----------------------------------


def _user_hooks_everywhere(model: nn.Module) -> list:
    """A no-op forward pre-hook on every module: the recorder then runs as hooks around each call
    (after the user's), never as a ``forward`` wrapper, and no closed form applies."""
    return [m.register_forward_pre_hook(lambda m, a: None) for m in model.modules()
            if not isinstance(m, torch.jit.ScriptModule)]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_forward_wrappers_give_the_graph_the_hooks_give(name):
    make_model, make_inputs = FIXTURES[name]
    torch.manual_seed(0)
    model, inputs = make_model(), make_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = trace_model(model, inputs, training_step=False)
        handles = _user_hooks_everywhere(model)
        hooked = trace_model(model, inputs, training_step=False)
    for h in handles:
        h.remove()
    assert wrapped == hooked
    assert not any("forward" in vars(m) or m._forward_hooks or m._forward_pre_hooks for m in model.modules()
                   if not isinstance(m, torch.jit.ScriptModule))


def test_a_trace_leaves_no_cycles_for_the_garbage_collector():
    """The recorder breaks the references back to itself (its modes', its forward wrappers'), so
    reference counting frees it and its records: a trace of a residual network (merges, functional
    code between layers) with the collector off leaves nothing for ``gc.collect()`` to find."""
    import gc

    model = load_example("resnet").ResNet18().eval()
    x = torch.randn(1, 3, 32, 32)
    trace_model(model, x, training_step=False)  # first-call caches (classes, formulas) made here
    gc.collect()
    gc.disable()
    try:
        graph = trace_model(model, x, training_step=False)
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert graph["measured"]["params"] == sum(p.numel() for p in model.parameters())


def test_forward_wrappers_are_removed_and_a_direct_forward_call_is_no_layer_call():
    import inspect

    seen_signatures = []

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.ReLU()

        def forward(self, x, scale: float = 1.0):  # noqa: ANN001, ANN201
            seen_signatures.append(list(inspect.signature(self.fc.forward).parameters))
            return self.act(self.fc(x)) * scale

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(8, 4)

        def forward(self, x):  # noqa: ANN001, ANN201
            # a direct forward call runs no hook: head is functional code here, as torchinfo sees it
            return self.head.forward(self.block(x)) + self.head(x)

    model, x = Net(), torch.randn(3, 8)
    graph = trace_model(model, x, training_step=False)
    names = [c["name"] for c in graph["components"] if c["type"] not in ("input", "output")]
    assert names == ["block.fc", "block.act", "head", "add"]
    assert seen_signatures == [["input"]]  # the wrapper shows the wrapped forward's signature
    assert graph["measured"]["functionalFlops"] == 2 * 3 * 8 * 4  # the direct call's matrix product
    assert not any("forward" in vars(m) for m in model.modules())

    class Fails(Net):
        def forward(self, x):  # noqa: ANN001, ANN201
            return self.head(self.block(x)[:, :3])

    broken = Fails()
    with pytest.raises(Exception, match="forward pass failed"):
        trace_model(broken, x, training_step=False)
    assert not any("forward" in vars(m) for m in broken.modules())


def test_a_module_whose_call_or_forward_is_its_own_is_hooked():
    class OwnCall(nn.Linear):  # a __call__ of its own that still runs nn.Module's
        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
            return super().__call__(*args, **kwargs)

    class Patched(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.own = OwnCall(8, 8)
            self.swapped = nn.Linear(8, 8)
            self.swapped.forward = lambda x: torch.nn.functional.linear(x, self.swapped.weight).relu()

        def forward(self, x):  # noqa: ANN001, ANN201
            return self.swapped(self.own(x))

    model = Patched()
    graph = assert_same(model, torch.randn(2, 8))
    flops = {c["name"]: c["measured"].get("flops") for c in graph["components"]}
    assert flops["own"] == flops["swapped"] == 2 * 2 * 8 * 8
    assert vars(model.swapped)["forward"] is not None and "forward" not in vars(model.own)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_transformers_sweep_graphs_are_the_reference_graphs(arch):
    transformers = pytest.importorskip("transformers")
    make_config, make_inputs = ARCHITECTURES[arch]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_config(make_config())
    assert_same(model, make_inputs())


@pytest.mark.slow
def test_a_model_calling_torch_compile_inside_its_forward():
    @torch.compile(backend="eager")
    def gate(x, w):  # noqa: ANN001, ANN202
        return torch.sigmoid(x @ w) * x

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):  # noqa: ANN001, ANN201
            return gate(self.fc(x), self.w)

    graph = assert_same(Gated(), torch.randn(2, 8))
    assert graph["measured"]["functionalFlops"] == 2 * 2 * 8 * 8


def zero_flop_samples() -> None:
    """One call or more of every function of ZERO_FLOP_FUNCTIONS."""
    F = torch.nn.functional
    x = torch.randn(2, 3, 4)
    b = x > 0
    i = torch.tensor([0, 1])
    x.view(6, 4), x.view_as(x), x.reshape(-1), x.reshape_as(x), x.transpose(0, 1), x.permute(2, 0, 1)
    x.transpose(0, 1).contiguous(), x.split(1), x.chunk(2, -1), x.unbind(), x.unsqueeze(0), x[:1].squeeze(0)
    x[:1].expand(3, 3, 4), x[:1].expand_as(x), x.flatten(), x.unflatten(-1, (2, 2)), x.narrow(0, 0, 1)
    x.select(0, 1), x[0].t(), x[0, 1:], x[i], x[b], x.to(torch.float64), x.float(), x.half(), x.bfloat16()
    x.long(), x.int(), x.bool(), x.type_as(i), x.clone(), x.detach(), x.repeat(2, 1, 1), x.repeat_interleave(2, 0)
    y = x.clone()
    y[0] = 1.0
    y[b] = 0.0
    y.masked_fill_(b, 1.0), x.masked_fill(b, 0.0), x.add(x), y.add_(x), x.sub(x), y.sub_(x), x.mul(x), y.mul_(2)
    x.div(2), y.div_(x.abs() + 1), x.neg(), x.pow(2), x.abs().sqrt(), (x.abs() + 1).rsqrt(), x.exp(), x.abs().log()
    x.abs(), x.tanh(), x.sigmoid(), x.relu(), x.softmax(-1), x.log_softmax(-1), x.clamp(-1, 1), x.mean(-1), x.sum()
    x.amax(-1), x.argmax(-1), x.cumsum(-1), x.eq(x), x.ne(x), x.lt(x), x.gt(x), x.le(x), x.ge(x), b.all(), b.any()
    x.flip(0), x.roll(1, 0), x[0].tril(), x[0].triu(), x + x, 1 + x, x - 1, 1 - x, x * x, 2 * x, x / 2, 2 / (x + 9), -x
    x ** 2, x == x, x != x, x < x, x > x, x <= x, x >= x, b & b, b | b, ~b, bool(b[0, 0, 0]), x[0, 0, 0].item()
    x.size(), x.dim()
    y += x
    y -= x
    y *= 2
    y /= 2
    torch.cat([x, x]), torch.concat([x, x]), torch.stack([x, x]), torch.arange(5), torch.zeros(2), torch.ones(2)
    torch.full((2,), 1.0), torch.zeros_like(x), torch.ones_like(x), torch.full_like(x, 2.0), torch.empty(2)
    torch.empty_like(x), torch.where(b, x, 0.0), torch.tril(x[0]), torch.triu(x[0]), torch.cumsum(x, 0), torch.diff(x)
    torch.tanh(x), torch.exp(x), torch.sigmoid(x), torch.masked_fill(x, b, 0.0), torch.flatten(x)
    torch.reshape(x, (-1,)), torch.transpose(x, 0, 1), torch.permute(x, (2, 0, 1)), torch.unsqueeze(x, 0)
    torch.squeeze(x[:1]), torch.split(x, 1), torch.chunk(x, 2)
    F.dropout(x, 0.5, True), F.dropout(x, 0.5, False), F.softmax(x, -1), F.log_softmax(x, -1), F.gelu(x), F.silu(x)
    F.relu(x), F.pad(x, (1, 1)), F.pad(x, (1, 1), mode="reflect"), F.layer_norm(x, (4,))
    F.embedding(torch.tensor([[0, 2]]), torch.randn(3, 4))


@pytest.mark.parametrize("mode", GRAD_MODES)
def test_the_functions_the_flop_mode_steps_aside_for_count_nothing(mode):
    from torch.overrides import TorchFunctionMode

    from neurarch_trace.flops import FlopMode
    from neurarch_trace.trace.closed_form import ZERO_FLOP_FUNCTIONS

    called = set()

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            called.add(func)
            return func(*args, **(kwargs or {}))

    counted = []
    context = {"plain": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
    with context[mode](), FlopMode(lambda flops, op: counted.append((op, flops))), Seen():
        zero_flop_samples()
    assert counted == []  # no FLOPs, no operation without a formula
    assert ZERO_FLOP_FUNCTIONS <= called  # the samples call every one of them


@pytest.mark.parametrize("q, k, v", [
    ((1, 12, 128, 64), (1, 12, 128, 64), (1, 12, 128, 64)),  # BERT-base's self-attention
    ((2, 32, 7, 128), (2, 8, 300, 128), (2, 8, 300, 96)),  # grouped key/value heads, cross lengths
    ((3, 1, 1, 1), (3, 1, 5, 1), (3, 1, 5, 2)),
])
def test_the_attention_formula_is_flop_counters(q, k, v):
    from torch.utils.flop_counter import sdpa_flop_count

    from neurarch_trace.flops import sdpa_flops

    assert sdpa_flops(q, k, v) == sdpa_flop_count(q, k, v)
    # and what a traced F.scaled_dot_product_attention charges, on the fast and the reference path
    query, key, value = torch.randn(q), torch.randn(k), torch.randn(v)

    class Attention(nn.Module):
        def forward(self, query, key, value):
            return nn.functional.scaled_dot_product_attention(query, key, value, enable_gqa=True)

    for path in (contextlib.nullcontext(), reference_path()):
        with path:
            graph = trace_model(Attention(), (query, key, value), training_step=False)
        assert graph["measured"]["flops"] == sdpa_flop_count(q, k, v)
