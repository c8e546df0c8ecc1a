"""Exact on the paths PyTorch takes behind the model's back (issue 18): fused fast paths, the batch
axis, every torch.nn layer typed and costed, and a model left as it was found. Every expected
number is computed here from the layer's own sizes."""

from __future__ import annotations

import warnings

import pytest
import torch
from graph_checks import assert_clean, by_name
from torch import nn

from neurarch_trace import trace_model

# --- 1. fused fast paths ------------------------------------------------------------------------


def encoder_flops(batch: int, tokens: int, width: int, ff: int, layers: int) -> int:
    """Q, K, V and output projections, Q·Kᵀ and P·V over every token pair, and the two feed-forward
    linears, per layer (2 FLOPs per multiply-add; masks and biases cost nothing)."""
    per_sample = (4 * 2 * tokens * width * width + 2 * 2 * tokens * tokens * width
                  + 2 * 2 * tokens * width * ff)
    return batch * layers * per_sample


class FrozenTower(nn.Module):
    """A frozen encoder used as a feature extractor (``requires_grad_(False)``), run under
    ``no_grad`` or ``inference_mode``, with an optional padding mask, and a trainable head."""

    def __init__(self, grad_mode: str, batch_first: bool = True) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
        with warnings.catch_warnings():  # PyTorch notes that a sequence-first encoder nests no tensors
            warnings.simplefilter("ignore")
            self.encoder = nn.TransformerEncoder(layer, 2)  # enable_nested_tensor=True: the default
        self.encoder.requires_grad_(False)
        self.head = nn.Linear(32, 3)
        self.grad_mode = grad_mode
        self.batch_first = batch_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor = None) -> torch.Tensor:  # noqa: RUF013
        context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                   "grad": torch.enable_grad}[self.grad_mode]
        with context():
            h = self.encoder(x if self.batch_first else x.transpose(0, 1), src_key_padding_mask=mask)
            h = h if self.batch_first else h.transpose(0, 1)
        return self.head(h[:, 0].clone())


#: The grad modes and layouts the fast run keeps (one each way); the other four are the full run's.
_FROZEN_FAST = {("no_grad", True), ("grad", False)}


@pytest.mark.parametrize("grad_mode, batch_first", [
    pytest.param(mode, first, marks=() if (mode, first) in _FROZEN_FAST else pytest.mark.slow)
    for first in (True, False) for mode in ("no_grad", "inference_mode", "grad")])
def test_frozen_encoder_counts_the_same_with_and_without_a_mask_at_every_depth(grad_mode, batch_first):
    model = FrozenTower(grad_mode, batch_first)
    x = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 4:] = True  # the second sequence has two padding tokens: the nested-tensor path
    expected = encoder_flops(2, 6, 32, 64, 2) + 2 * 2 * 32 * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's own notes on nested tensors
        for depth in (None, 0, 1, 2, 3, 4):
            for kwargs in ({}, {"mask": mask}):
                # FLOPs and counts: the rehearsed step is not what this checks (test_rehearsal does)
                graph = trace_model(model, (x,), kwargs=kwargs, depth=depth, training_step=False)
                assert graph["measured"]["uncountedOps"] == [], (depth, kwargs)
                assert graph["measured"]["flops"] == expected, (depth, kwargs)
                assert all(c["measured"].get("flops", 0) is not None for c in graph["components"])
    assert torch.backends.mha.get_fastpath_enabled()  # switched back on after the trace


def test_frozen_attention_block_keeps_its_projections():
    # the ViT/CLIP-style block: nn.MultiheadAttention in eval under no_grad read 192 FLOPs
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
            self.fc = nn.Linear(16, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                y, _ = self.attn(x, x, x, need_weights=False)
            return self.fc(y)

    graph = trace_model(Block(), torch.randn(1, 8, 16))
    attn = by_name(graph)["attn"]["measured"]
    # in-projection 3x(16x16), Q·Kᵀ and P·V over 8x8 token pairs, out-projection 16x16; 8 tokens
    assert attn["flops"] == 2 * 8 * 16 * 48 + 2 * 2 * 8 * 8 * 16 + 2 * 8 * 16 * 16 == 20480
    assert by_name(graph)["fc"]["measured"]["flops"] == 2 * 8 * 16 * 6
    assert graph["measured"]["uncountedOps"] == []


def test_fast_path_switch_restored_when_the_forward_raises():
    torch.backends.mha.set_fastpath_enabled(True)

    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert not torch.backends.mha.get_fastpath_enabled()
            raise ValueError("no")

    with pytest.raises(Exception, match="no"):
        trace_model(Broken(), torch.randn(1, 2))
    assert torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # a user's own choice is kept too
    try:
        trace_model(nn.Linear(2, 2), torch.randn(1, 2))
        assert not torch.backends.mha.get_fastpath_enabled()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


# --- 4. the model as it was found ----------------------------------------------------------------


class RunningNorm(nn.Module):
    """A custom normaliser that updates its running statistics in every forward (eval included),
    counts its calls in a buffer and a Python attribute, rebinds a cache buffer, and writes its own
    learned scale in place."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(width))
        self.register_buffer("running_var", torch.ones(width))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("last", torch.zeros(1, width))
        self.scale = nn.Parameter(torch.ones(width))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.running_mean.mul_(0.9).add_(0.1 * x.mean(0))
            self.running_var.lerp_(x.var(0), 0.1)
            self.steps += 1
            self.scale.clamp_(max=0.5)
        self.last = x.detach()[:1].clone()  # rebinds the buffer to a new tensor
        self.calls += 1
        return (x - self.running_mean) / (self.running_var + 1e-5).sqrt() * self.scale


class Mutating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = RunningNorm(4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.norm(self.fc(x)))


def state_of(model: nn.Module) -> dict:
    state = {f"p:{k}": v.detach().clone() for k, v in model.named_parameters()}
    state.update({f"b:{k}": v.detach().clone() for k, v in model.named_buffers()})
    return state


@pytest.mark.parametrize("training", [False, True])
def test_trace_leaves_buffers_parameters_and_attributes_bit_identical(training):
    model = Mutating().train(training)
    with torch.no_grad():  # statistics that are not the defaults, so a reset would show
        model.norm.running_mean.fill_(0.25)
        model.bn.running_var.fill_(2.0)
    before = state_of(model)
    model(torch.randn(5, 4))  # the forward itself does change them
    assert not torch.equal(model.norm.running_mean, before["b:norm.running_mean"])
    assert model.norm.calls == 1
    model.load_state_dict({k[2:]: v for k, v in before.items()})
    model.norm.calls = 0
    ids = {k: id(v) for k, v in list(model.named_parameters()) + list(model.named_buffers())}
    versions = {k: v._version for k, v in model.named_buffers()}
    graph = trace_model(model, torch.randn(3, 4))
    assert_clean(graph)
    after = state_of(model)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype and torch.equal(after[key], value), key
    assert {k: id(v) for k, v in list(model.named_parameters()) + list(model.named_buffers())} == ids
    assert model.norm.calls == 0 and model.training is training and model.bn.training is training
    # a buffer the forward left alone was not written back (its version counter did not move)
    assert model.bn.running_mean._version == versions["bn.running_mean"]


@pytest.mark.parametrize("training_step", [False, True])
def test_a_parametrized_weight_read_after_the_forward_writes_nothing(training_step):
    # spectral_norm's power iteration writes _u and _v whenever the weight is computed in train
    # mode; the records' settling read it after the forward, with the model's flags back on train
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    model = nn.Sequential(parametrizations.spectral_norm(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 4)).train()
    x = torch.randn(2, 8)
    before = state_of(model)
    graph = trace_model(model, (x,), training_step=training_step)
    assert graph["measured"]["params"] == sum(p.numel() for p in model.parameters())
    for key, value in state_of(model).items():
        assert torch.equal(value, before[key]), key
    expected = model(x)  # the power iteration in train mode, as before the trace
    model.load_state_dict({k[2:]: v for k, v in before.items()})
    assert torch.equal(model(x), expected)


def test_trace_restores_the_model_when_the_forward_raises():
    class Fails(Mutating):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            super().forward(x)
            raise RuntimeError("late failure")

    model = Fails()
    before = state_of(model)
    with pytest.raises(Exception, match="late failure"):
        trace_model(model, torch.randn(3, 4))
    for key, value in state_of(model).items():
        assert torch.equal(value, before[key]), key


def test_the_rehearsed_step_leaves_rebound_attributes_as_they_were():
    class Remembers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.calls = 0
            self.cache = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            self.cache = x.detach()
            return self.fc(x)

    model = Remembers()
    graph = trace_model(model, torch.randn(3, 4))
    assert "error" not in graph["measured"]["training"]  # the step ran the forward (twice) on meta
    assert model.calls == 0 and model.cache is None


def test_a_torchscript_part_gives_the_same_step_on_every_trace():
    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x)) + x

    class WithScript(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre, self.scripted, self.post = nn.Linear(4, 8), torch.jit.script(Small()), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.post(self.scripted(self.pre(x)))

    model = WithScript()
    # TorchScript's executor optimises a graph after its first calls; the rehearsal runs it as written
    first, second, third = (trace_model(model, torch.randn(2, 4)) for _ in range(3))
    assert first == second == third
    assert first["measured"]["training"]["batchSizes"] == [2, 4]


def test_buffers_of_every_dtype_and_layout_come_back_however_they_were_written():
    """Buffers kept in one flat copy per dtype: each comes back from its own slice, whether the
    forward wrote it in place, through ``.data`` (no version counter moves), rebound it to another
    shape through ``.data``, or left it alone (then it is not written at all)."""

    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("low", torch.arange(6, dtype=torch.float16).reshape(2, 3))
            self.register_buffer("count", torch.tensor(7))
            self.register_buffer("flags", torch.tensor([True, False, True]))
            self.register_buffer("wide", torch.arange(12.0).reshape(3, 4).t())  # not contiguous
            self.register_buffer("quiet", torch.arange(5.0))
            self.register_buffer("grown", torch.ones(2))
            # a PyTorch layer that writes its buffers (min_val, max_val) in place in every forward
            self.observer = torch.ao.quantization.MinMaxObserver()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.observer(x)
            self.low.data.mul_(3)  # .data: no version counter moves
            self.count += 5
            self.flags.data.fill_(False)
            self.wide.add_(1)
            self.grown.data = torch.zeros(9)  # another size, through .data
            return self.fc(x) + self.quiet.sum()

    written = Writes()
    before = {k: v.clone() for k, v in written.named_buffers()}
    written(torch.randn(2, 4))  # the forward does write every buffer but one
    assert [k for k, v in written.named_buffers() if v.shape == before[k].shape and torch.equal(v, before[k])] \
        == ["quiet", "observer.eps"]
    model = Writes()
    versions = {k: v._version for k, v in model.named_buffers()}
    trace_model(model, torch.randn(2, 4))
    for key, value in model.named_buffers():
        assert value.dtype == before[key].dtype and value.shape == before[key].shape, key
        assert torch.equal(value, before[key]), key
    assert model.quiet._version == versions["quiet"]  # left alone: not written back
    assert not model.wide.is_contiguous()


def test_state_guard_on_the_meta_device():
    with torch.device("meta"):
        model = Mutating()
    graph = trace_model(model, torch.empty(3, 4, device="meta"))
    assert graph["measured"]["params"] == sum(p.numel() for p in model.parameters())
    assert model.norm.calls == 0 and model.norm.steps.is_meta


# --- 2. the batch axis, followed through the data flow --------------------------------------------


def shapes_of(graph: dict) -> dict:
    """Every batchless shape of a graph, by component name."""
    out = {}
    for c in graph["components"]:
        m = c["measured"]
        out[c["name"]] = (c.get("inputShape"), c.get("outputShape"), c["params"].get("shape"),
                          m.get("outputShapes"), m.get("inputShapes"))
    return out


def at_batch(value, batch: int):
    """``value`` (tensors, dicts, lists, batch first) with ``batch`` items: rows repeated or cut."""
    if isinstance(value, torch.Tensor):
        return value[torch.arange(batch) % value.shape[0]].clone()
    if isinstance(value, dict):
        return {k: at_batch(v, batch) for k, v in value.items()}
    return tuple(at_batch(v, batch) for v in value)


def assert_batch_invariant(model: nn.Module, inputs, batches=(2, 3, 4, 7)) -> dict:
    """Trace at each batch size: identical batchless shapes everywhere, none unknown."""
    reference = None
    for batch in batches:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = trace_model(model, at_batch(inputs, batch), training_step=False)  # shapes alone
        assert graph["measured"]["batchSize"] == batch
        lost = {c["name"]: c["measured"]["batchUnknown"] for c in graph["components"]
                if "batchUnknown" in c["measured"]}
        assert not lost, (batch, lost)
        shapes = shapes_of(graph)
        if reference is None:
            reference = shapes
        else:
            changed = {k: (reference[k], shapes.get(k)) for k in reference if reference[k] != shapes.get(k)}
            assert not changed, (batch, changed)
    return reference


class PerItemPool(nn.Module):
    """The issue's example: a per-item loop with AdaptiveAvgPool1d(4), stacked back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 32, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.conv(x)
        return torch.stack([self.pool(feats[i]) for i in range(feats.shape[0])])


def test_per_item_loop_keeps_every_axis_at_every_batch():
    shapes = assert_batch_invariant(PerItemPool(), (torch.randn(1, 8, 10),), batches=(1, 2, 4, 7, 32))
    assert shapes["pool"][:2] == ([32, 10], [32, 4])  # one item: (C, L), no batch axis to strip
    assert shapes["conv"][:2] == ([8, 10], [32, 10])
    assert shapes["output"][0] == [32, 4]


class Detector(nn.Module):
    """A list of per-image dicts (as detection models take): boxes first, not batch first."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Conv2d(3, 4, 3, padding=1)
        self.boxes = nn.Linear(4, 4)

    def forward(self, batch: list) -> tuple:
        images = torch.stack([item["image"] for item in batch])
        feats = self.backbone(images)
        return feats.mean((2, 3)), [self.boxes(item["boxes"]) for item in batch]


def test_list_of_dicts_is_a_list_of_samples():
    samples = [{"boxes": torch.randn(5, 4), "image": torch.randn(3, 8, 8)} for _ in range(2)]
    graph = trace_model(Detector(), (samples,))
    assert_clean(graph)
    comps = by_name(graph)
    assert graph["measured"]["batchSize"] == 2  # the list's length, not the boxes' 5
    assert comps["batch.0.boxes"]["outputShape"] == [5, 4]  # a sample's shape: nothing stripped
    assert comps["batch.0.image"]["outputShape"] == [3, 8, 8]
    assert comps["backbone"]["inputShape"] == [3, 8, 8]  # the images stacked into a batch
    assert comps["backbone"]["outputShape"] == [4, 8, 8]
    assert comps["boxes"]["inputShape"] == [5, 4] and comps["boxes"]["outputShape"] == [5, 4]
    assert comps["output"]["measured"]["outputShapes"] == [[4], [5, 4], [5, 4]]
    for count in (3, 5):  # five samples of five boxes each: still nothing stripped
        graph = trace_model(Detector(), ([dict(samples[0]) for _ in range(count)],))
        assert by_name(graph)["batch.0.boxes"]["outputShape"] == [5, 4]
        assert by_name(graph)["boxes#2"]["outputShape"] == [5, 4]


def test_an_axis_of_the_batch_size_is_not_the_batch():
    # position ids from torch.arange when the sequence is as long as the batch is large
    gpt = pytest.importorskip("helpers").load_example("gpt").TinyGPT()
    graph = trace_model(gpt, torch.randint(0, 8192, (4, 4)))
    comps = by_name(graph)
    assert comps["wpe"]["inputShape"] == [4] and comps["wpe"]["outputShape"] == [4, 256]
    assert comps["wte"]["inputShape"] == [4] and comps["wte"]["outputShape"] == [4, 256]
    assert comps["lm_head"]["outputShape"] == [4, 8192]

    class Table(nn.Module):  # a learned table whose first axis happens to be the batch size
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.randn(3, 6))
            self.fc = nn.Linear(6, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) @ self.fc(self.table).T

    graph = trace_model(Table(), torch.randn(3, 6))
    assert by_name(graph)["fc#2"]["inputShape"] == [3, 6]  # the table's rows are not samples
    assert by_name(graph)["fc"]["inputShape"] == [6]
    assert by_name(graph)["output"]["inputShape"] == [3]


def test_a_lost_batch_axis_is_kept_whole_and_said():
    class Picks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x[torch.tensor([0, 2])])  # samples chosen by a tensor index

    graph = trace_model(Picks(), torch.randn(4, 6))
    fc = by_name(graph)["fc"]
    assert fc["inputShape"] == [2, 6] and fc["outputShape"] == [2, 2]  # whole: nothing guessed
    assert fc["measured"]["batchUnknown"] == ["inputShape", "outputShapes.0"]
    assert by_name(graph)["output"]["measured"]["batchUnknown"] == ["inputShape", "outputShapes.0"]
    assert "batchUnknown" not in by_name(graph)["x"]["measured"]


class Reshapes(nn.Module):
    """Heads split off and merged back, tokens flattened into one axis and restored, windows cut
    out of an image (Swin), einsum, a squeeze of the batch, a transposed matmul, a reduction."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.proj = nn.Linear(16, 16)
        self.tokens = nn.Linear(16, 16)
        self.window = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 4).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, 16)
        flat = self.tokens(self.proj(y).reshape(-1, 16)).view(b, t, 16)  # (B*T, 16) and back
        grid = flat.view(b, 4, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(-1, 4, 4)  # windows of 4x4
        w = self.window(grid).view(b, 4, 4, 4, 4).sum(1)
        return w.flatten(1) + (x.mT @ x).mean(-1).repeat(1, 16)[:, :64]


def test_reshapes_transposes_and_merged_batches_are_followed():
    shapes = assert_batch_invariant(Reshapes(), (torch.randn(1, 16, 16),))
    assert shapes["tokens"][:2] == ([16, 16], [16, 16])  # the batch merged with the tokens: T rows
    assert shapes["window"][:2] == ([16, 4, 4], [16, 4, 4])  # sixteen windows of 4x4 per image
    assert shapes["proj"][:2] == ([16, 16], [16, 16])
    assert shapes["output"][0] == [64]


def test_sequence_first_and_recurrent_layouts_at_every_batch():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)  # batch_first=False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    class SeqFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            self.rnn = nn.GRU(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, h = self.rnn(self.encoder(x.transpose(0, 1)))
            return out.transpose(0, 1), h[-1]

    shapes = assert_batch_invariant(SeqFirst(), (torch.randn(1, 7, 16),))
    assert shapes["encoder.layers.0.self_attn"][:2] == ([7, 16], [7, 16])
    assert shapes["rnn"][3] == [[7, 8], [1, 8]]
    assert shapes["output"][3] == [[7, 8], [8]]


FIXTURES = {
    "LSTMTagger": torch.randint(0, 500, (1, 7)), "SeqFirstLSTM": torch.randn(1, 6, 10),
    "AttentionBlock": torch.randn(1, 5, 32), "CalledTwice": torch.randn(1, 16), "InplaceResidual": torch.randn(1, 8),
    "CatStack": torch.randn(1, 8), "DictOutput": torch.randn(1, 8),
    "TwoInput": (torch.randn(1, 3, 8, 8), torch.randn(1, 5)),
    "IntegerPath": torch.randint(0, 50, (1, 5)), "SmallVocab": torch.randint(0, 100, (1, 9)),
    "WithUnknownLeaf": torch.randn(1, 6), "Deep": torch.randn(1, 8), "TinyViT": torch.randn(1, 3, 32, 32),
    "GatedResidual": torch.randn(1, 8), "TiedLM": torch.randint(0, 64, (1, 5)), "SharedParents": torch.randn(1, 8),
    "Containers": torch.randn(1, 8), "PartlyNoGrad": torch.randn(1, 8), "WithScripted": torch.randn(1, 8),
    "ComplexLinear": torch.randn(1, 8, dtype=torch.complex64), "ShadowedMethods": torch.randn(1, 8),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "LSTMTagger" else n
                                  for n in sorted(FIXTURES)])  # the tagger's steps take seconds: the full run's
def test_fixtures_trace_to_the_same_shapes_at_every_batch(name):
    import fixture_models as fm

    inputs = FIXTURES[name]
    assert_batch_invariant(getattr(fm, name)(), inputs if isinstance(inputs, tuple) else (inputs,))


@pytest.mark.parametrize("name", ["resnet", "vit", "gpt"])
def test_examples_trace_to_the_same_shapes_at_every_batch(name):
    from helpers import load_example

    module = load_example(name)
    model, x = {"resnet": (lambda: module.ResNet18(), torch.randn(1, 3, 32, 32)),
                "vit": (lambda: module.ViT_Tiny(), torch.randn(1, 3, 32, 32)),
                "gpt": (lambda: module.TinyGPT(), torch.randint(0, 8192, (1, 16)))}[name]
    assert_batch_invariant(model(), (x,))


@pytest.mark.slow  # 84 traces: the fixtures and examples above keep the fast loop's coverage
@pytest.mark.parametrize("arch", sorted(__import__("test_architectures").CASES))
def test_architectures_trace_to_the_same_shapes_at_every_batch(arch):
    sweep = pytest.importorskip("test_architectures")
    make_config, make_inputs = sweep.CASES[arch]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = sweep.T.AutoModel.from_config(make_config())
    inputs = make_inputs()
    names = list(inputs)
    shapes = assert_batch_invariant(_KeywordModel(model, names), tuple(inputs[n] for n in names))
    assert shapes


class _KeywordModel(nn.Module):
    """Calls ``model`` with keyword arguments given positionally (so :func:`at_batch` can resize
    them); the wrapped model's names keep their ``model.`` prefix."""

    def __init__(self, model: nn.Module, names: list) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *values: torch.Tensor):  # noqa: ANN201
        return self.model(**dict(zip(self.names, values)))


# --- 3. every torch.nn layer typed and costed -----------------------------------------------------

from neurarch_trace.mapping import CUSTOM_REASONS, NOT_LAYERS, typed_class  # noqa: E402


def public_torch_nn_classes() -> list:
    return sorted({c for c in vars(torch.nn).values() if isinstance(c, type) and issubclass(c, nn.Module)},
                  key=lambda c: c.__name__)


def eager(cls: type) -> type:
    """A lazy layer (nn.LazyLinear) becomes its eager class in its first forward."""
    return getattr(cls, "cls_to_become", None) or cls


def test_every_torch_nn_class_is_typed_or_listed_with_a_reason():
    missing, twice = [], []
    for cls in public_torch_nn_classes():
        target = eager(cls)
        places = [typed_class(target), target in CUSTOM_REASONS, target in NOT_LAYERS]
        if not any(places):
            missing.append(cls.__name__)
        elif sum(places) > 1 and not (target in NOT_LAYERS and typed_class(target)):
            twice.append(cls.__name__)
    assert not missing, f"torch.nn classes neither mapped nor listed in mapping.CUSTOM_REASONS/NOT_LAYERS: {missing}"
    assert not twice, twice
    assert all(isinstance(r, str) and len(r) > 8 for r in list(CUSTOM_REASONS.values()) + list(NOT_LAYERS.values()))


def x1() -> torch.Tensor:
    return torch.randn(2, 4, 8)


def x2() -> torch.Tensor:
    return torch.randn(2, 4, 8, 8)


def x3() -> torch.Tensor:
    return torch.randn(2, 4, 4, 4, 4)


def pair(*shape: int) -> tuple:
    return torch.randn(2, *shape), torch.randn(2, *shape)


def scores() -> tuple:
    return torch.randn(2, 8), torch.randint(0, 8, (2,))


#: One instance and input of every torch.nn layer, and the FLOPs it costs at batch 2: 0 for
#: elementwise ops, reductions, data movement and interpolation (the convention), the closed form
#: otherwise (2 FLOPs per multiply-add).
LAYERS = {
    "AdaptiveAvgPool1d": (lambda: nn.AdaptiveAvgPool1d(3), x1, 0),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d(3), x2, 0),
    "AdaptiveAvgPool3d": (lambda: nn.AdaptiveAvgPool3d(2), x3, 0),
    "AdaptiveMaxPool1d": (lambda: nn.AdaptiveMaxPool1d(3), x1, 0),
    "AdaptiveMaxPool2d": (lambda: nn.AdaptiveMaxPool2d(3), x2, 0),
    "AdaptiveMaxPool3d": (lambda: nn.AdaptiveMaxPool3d(2), x3, 0),
    "AlphaDropout": (lambda: nn.AlphaDropout(0.2), x1, 0),
    "AvgPool1d": (lambda: nn.AvgPool1d(2), x1, 0), "AvgPool2d": (lambda: nn.AvgPool2d(2), x2, 0),
    "AvgPool3d": (lambda: nn.AvgPool3d(2), x3, 0),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(4), x1, 0), "BatchNorm2d": (lambda: nn.BatchNorm2d(4), x2, 0),
    "BatchNorm3d": (lambda: nn.BatchNorm3d(4), x3, 0), "SyncBatchNorm": (lambda: nn.SyncBatchNorm(4), x2, 0),
    "Bilinear": (lambda: nn.Bilinear(4, 5, 3), lambda: (torch.randn(2, 4), torch.randn(2, 5)), 2 * 2 * 3 * 4 * 5),
    "CELU": (nn.CELU, x1, 0), "ELU": (nn.ELU, x1, 0), "GELU": (nn.GELU, x1, 0), "GLU": (nn.GLU, x1, 0),
    "Hardshrink": (nn.Hardshrink, x1, 0), "Hardsigmoid": (nn.Hardsigmoid, x1, 0), "Hardswish": (nn.Hardswish, x1, 0),
    "Hardtanh": (nn.Hardtanh, x1, 0), "LeakyReLU": (nn.LeakyReLU, x1, 0), "LogSigmoid": (nn.LogSigmoid, x1, 0),
    "LogSoftmax": (lambda: nn.LogSoftmax(-1), x1, 0), "Mish": (nn.Mish, x1, 0), "PReLU": (nn.PReLU, x1, 0),
    "RReLU": (nn.RReLU, x1, 0), "ReLU": (nn.ReLU, x1, 0), "ReLU6": (nn.ReLU6, x1, 0), "SELU": (nn.SELU, x1, 0),
    "SiLU": (nn.SiLU, x1, 0), "Sigmoid": (nn.Sigmoid, x1, 0), "Softmax": (lambda: nn.Softmax(-1), x1, 0),
    "Softmax2d": (nn.Softmax2d, x2, 0), "Softmin": (lambda: nn.Softmin(-1), x1, 0), "Softplus": (nn.Softplus, x1, 0),
    "Softshrink": (nn.Softshrink, x1, 0), "Softsign": (nn.Softsign, x1, 0), "Tanh": (nn.Tanh, x1, 0),
    "Tanhshrink": (nn.Tanhshrink, x1, 0), "Threshold": (lambda: nn.Threshold(0.1, 0.0), x1, 0),
    "ChannelShuffle": (lambda: nn.ChannelShuffle(2), x2, 0),
    **{f"{kind}Pad{d}d": (lambda kind=kind, d=d: getattr(nn, f"{kind}Pad{d}d")(
        *((1, 0.0) if kind == "Constant" else (1,))), {1: x1, 2: x2, 3: x3}[d], 0)
       for kind in ("Constant", "Zero", "Reflection", "Replication", "Circular") for d in (1, 2, 3)},
    "Conv1d": (lambda: nn.Conv1d(4, 6, 3), x1, 2 * 2 * 6 * 6 * 4 * 3),
    "Conv2d": (lambda: nn.Conv2d(4, 6, 3), x2, 2 * 2 * 6 * 36 * 4 * 9),
    "Conv3d": (lambda: nn.Conv3d(4, 6, 3), x3, 2 * 2 * 6 * 8 * 4 * 27),
    # a transposed conv: every input element meets the whole kernel
    "ConvTranspose1d": (lambda: nn.ConvTranspose1d(4, 6, 3), x1, 2 * 2 * 8 * 4 * 6 * 3),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(4, 6, 3), x2, 2 * 2 * 64 * 4 * 6 * 9),
    "ConvTranspose3d": (lambda: nn.ConvTranspose3d(4, 6, 3), x3, 2 * 2 * 64 * 4 * 6 * 27),
    "CosineSimilarity": (nn.CosineSimilarity, lambda: pair(8), 0),
    "PairwiseDistance": (nn.PairwiseDistance, lambda: pair(8), 0),
    "CrossMapLRN2d": (lambda: nn.CrossMapLRN2d(3), x2, 0),
    "LocalResponseNorm": (lambda: nn.LocalResponseNorm(3), x2, 0),
    "Dropout": (nn.Dropout, x1, 0), "Dropout1d": (nn.Dropout1d, x1, 0), "Dropout2d": (nn.Dropout2d, x2, 0),
    "Dropout3d": (nn.Dropout3d, x3, 0), "FeatureAlphaDropout": (nn.FeatureAlphaDropout, x2, 0),
    "Embedding": (lambda: nn.Embedding(10, 4), lambda: torch.randint(0, 10, (2, 3)), 0),
    "EmbeddingBag": (lambda: nn.EmbeddingBag(10, 4), lambda: torch.randint(0, 10, (2, 3)), 0),
    "Flatten": (nn.Flatten, x2, 0), "Unflatten": (lambda: nn.Unflatten(1, (2, 2)), x1, 0),
    "Fold": (lambda: nn.Fold((4, 4), 2), lambda: torch.randn(2, 16, 9), 0), "Unfold": (lambda: nn.Unfold(2), x2, 0),
    "FractionalMaxPool2d": (lambda: nn.FractionalMaxPool2d(2, output_size=3), x2, 0),
    "FractionalMaxPool3d": (lambda: nn.FractionalMaxPool3d(2, output_size=2), x3, 0),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), x2, 0), "LayerNorm": (lambda: nn.LayerNorm(8), x1, 0),
    "RMSNorm": (lambda: nn.RMSNorm(8), x1, 0), "InstanceNorm1d": (lambda: nn.InstanceNorm1d(4), x1, 0),
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(4), x2, 0), "InstanceNorm3d": (lambda: nn.InstanceNorm3d(4), x3, 0),
    # cells: the gates' two matmuls, W_ih·x and W_hh·h, per sample
    "RNNCell": (lambda: nn.RNNCell(8, 6), lambda: torch.randn(2, 8), 2 * 2 * 6 * (8 + 6)),
    "LSTMCell": (lambda: nn.LSTMCell(8, 6), lambda: torch.randn(2, 8), 2 * 2 * 4 * 6 * (8 + 6)),
    "GRUCell": (lambda: nn.GRUCell(8, 6), lambda: torch.randn(2, 8), 2 * 2 * 3 * 6 * (8 + 6)),
    "RNN": (lambda: nn.RNN(8, 6, batch_first=True), lambda: torch.randn(2, 3, 8), 2 * 3 * 2 * 6 * (8 + 6)),
    "LSTM": (lambda: nn.LSTM(8, 6, batch_first=True), lambda: torch.randn(2, 3, 8), 2 * 3 * 2 * 4 * 6 * (8 + 6)),
    "GRU": (lambda: nn.GRU(8, 6, batch_first=True), lambda: torch.randn(2, 3, 8), 2 * 3 * 2 * 3 * 6 * (8 + 6)),
    "Linear": (lambda: nn.Linear(8, 3), x1, 2 * 2 * 4 * 8 * 3),
    "LPPool1d": (lambda: nn.LPPool1d(2, 2), x1, 0), "LPPool2d": (lambda: nn.LPPool2d(2, 2), x2, 0),
    "LPPool3d": (lambda: nn.LPPool3d(2, 2), x3, 0),
    "MaxPool1d": (lambda: nn.MaxPool1d(2), x1, 0), "MaxPool2d": (lambda: nn.MaxPool2d(2), x2, 0),
    "MaxPool3d": (lambda: nn.MaxPool3d(2), x3, 0),
    "MaxUnpool1d": (lambda: nn.MaxUnpool1d(2), lambda: nn.MaxPool1d(2, return_indices=True)(x1()), 0),
    "MaxUnpool2d": (lambda: nn.MaxUnpool2d(2), lambda: nn.MaxPool2d(2, return_indices=True)(x2()), 0),
    "MaxUnpool3d": (lambda: nn.MaxUnpool3d(2), lambda: nn.MaxPool3d(2, return_indices=True)(x3()), 0),
    # in-projection, Q·Kᵀ and P·V over 5x5 token pairs, out-projection; 2 sequences of 5 tokens of 8
    "MultiheadAttention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                           lambda: (torch.randn(2, 5, 8),) * 3,
                           2 * (2 * 5 * 8 * 24 + 2 * 2 * 5 * 5 * 8 + 2 * 5 * 8 * 8)),
    "PixelShuffle": (lambda: nn.PixelShuffle(2), x2, 0), "PixelUnshuffle": (lambda: nn.PixelUnshuffle(2), x2, 0),
    "Upsample": (lambda: nn.Upsample(scale_factor=2, mode="bilinear"), x2, 0),
    "UpsamplingNearest2d": (lambda: nn.UpsamplingNearest2d(scale_factor=2), x2, 0),
    "UpsamplingBilinear2d": (lambda: nn.UpsamplingBilinear2d(scale_factor=2), x2, 0),
    **{name: (lambda name=name: getattr(nn, name)(), lambda: (torch.rand(2, 8), torch.rand(2, 8)), 0) for name in (
        "L1Loss", "MSELoss", "BCELoss", "BCEWithLogitsLoss", "HuberLoss", "SmoothL1Loss", "SoftMarginLoss",
        "KLDivLoss", "PoissonNLLLoss", "HingeEmbeddingLoss", "MultiLabelSoftMarginLoss")},
    "CrossEntropyLoss": (nn.CrossEntropyLoss, scores, 0), "NLLLoss": (nn.NLLLoss, scores, 0),
    "MultiMarginLoss": (nn.MultiMarginLoss, scores, 0),
    "NLLLoss2d": (lambda: nn.NLLLoss2d(), lambda: (torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))), 0),
    "GaussianNLLLoss": (nn.GaussianNLLLoss, lambda: (*pair(8), torch.rand(2, 8)), 0),
    "MarginRankingLoss": (nn.MarginRankingLoss, lambda: (*pair(8)[:1], torch.randn(2, 8), torch.ones(2, 8)), 0),
    "CosineEmbeddingLoss": (nn.CosineEmbeddingLoss, lambda: (*pair(8), torch.ones(2)), 0),
    "MultiLabelMarginLoss": (nn.MultiLabelMarginLoss, lambda: (torch.randn(2, 8), torch.randint(0, 8, (2, 8))), 0),
    "TripletMarginLoss": (nn.TripletMarginLoss, lambda: (*pair(8), torch.randn(2, 8)), 0),
    "TripletMarginWithDistanceLoss": (nn.TripletMarginWithDistanceLoss, lambda: (*pair(8), torch.randn(2, 8)), 0),
    "CTCLoss": (nn.CTCLoss, lambda: (torch.randn(6, 2, 5).log_softmax(2), torch.randint(1, 5, (2, 3)),
                                     torch.full((2,), 6), torch.full((2,), 3)), 0),
    "LinearCrossEntropyLoss": (lambda: nn.LinearCrossEntropyLoss(8, 5),
                               lambda: (torch.randn(2, 8), torch.randint(0, 5, (2,))), 2 * 2 * 8 * 5),
    "AdaptiveLogSoftmaxWithLoss": (lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4], div_value=2.0),
                                   lambda: (torch.randn(2, 8), torch.tensor([1, 7])),
                                   2 * 2 * 8 * 5 + 2 * 1 * (8 * 4 + 4 * 6)),  # head 4+1 outputs; tail for one
    "TransformerEncoderLayer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                lambda: torch.randn(2, 5, 8), encoder_flops(2, 5, 8, 16, 1)),
    "TransformerDecoderLayer": (lambda: nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                lambda: (torch.randn(2, 5, 8), torch.randn(2, 4, 8)),
                                # self-attention over 5 tokens, cross-attention to 4, feed-forward
                                2 * (4 * 2 * 5 * 64 + 2 * 2 * 25 * 8)
                                + 2 * (2 * 2 * 5 * 64 + 2 * 2 * 4 * 64 + 2 * 2 * 20 * 8)
                                + 2 * 2 * 2 * 5 * 8 * 16),
}


def test_every_torch_nn_layer_is_traced_with_a_type_and_a_cost():
    leaves = [c for c in public_torch_nn_classes() if eager(c) not in NOT_LAYERS]
    untested = sorted({eager(c).__name__ for c in leaves} - set(LAYERS))
    assert not untested, f"add a case for {untested}"
    problems = []
    for name, (make, inputs, expected) in sorted(LAYERS.items()):
        layer = make()
        x = inputs()
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = trace_model(layer, x if isinstance(x, tuple) else (x,))
        assert_clean(graph)
        nodes = [c for c in graph["components"] if c["type"] not in ("input", "output")]
        kind = nodes[0]["type"] if len(nodes) == 1 else "(traced into its layers)"
        if kind == "customModule" and eager(type(layer)) not in CUSTOM_REASONS:
            problems.append(f"{name}: customModule without a reason")
        if graph["measured"]["uncountedOps"] or any(c["measured"].get("flops", 0) is None for c in nodes):
            problems.append(f"{name}: uncounted {graph['measured']['uncountedOps']}")
        elif graph["measured"]["flops"] != expected:
            problems.append(f"{name}: {graph['measured']['flops']} FLOPs, expected {expected}")
    assert not problems, problems


@pytest.mark.parametrize("mode", ["nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact"])
def test_interpolation_costs_zero_whatever_its_mode(mode):
    x = {"linear": x1, "trilinear": x3}.get(mode, x2)()
    graph = trace_model(nn.Upsample(scale_factor=2, mode=mode), x)
    node = next(c for c in graph["components"] if c["type"] == "upsample")
    assert node["measured"]["flops"] == 0 and graph["measured"]["uncountedOps"] == []
    assert node["params"]["mode"] == mode


def test_bilinear_in_functional_code_is_counted():
    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4, 5))
            self.head = nn.Linear(3, 1)

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.head(nn.functional.bilinear(a, b, self.w))

    graph = trace_model(Gate(), (torch.randn(2, 4), torch.randn(2, 5)))
    assert graph["measured"]["functionalFlops"] == 2 * 2 * 3 * 4 * 5
    assert graph["measured"]["uncountedOps"] == []


def test_types_of_the_new_mappings():
    def one(layer: nn.Module, x: torch.Tensor) -> dict:
        graph = trace_model(layer, x)
        return next(c for c in graph["components"] if c["type"] not in ("input", "output"))

    assert one(nn.AdaptiveAvgPool1d(4), x1())["params"] == {"outputSize": 4}
    assert one(nn.AdaptiveAvgPool1d(4), x1())["type"] == "adaptiveAvgPool2d"
    assert one(nn.AdaptiveAvgPool3d(1), x3())["type"] == "globalAvgPool2d"
    assert one(nn.PixelShuffle(2), x2())["params"] == {"scaleFactor": 2, "mode": "pixelShuffle"}
    assert one(nn.PixelUnshuffle(2), x2())["params"] == {"scaleFactor": 0.5, "mode": "pixelUnshuffle"}
    assert one(nn.LSTMCell(8, 6), torch.randn(2, 8))["params"] == {"inputSize": 8, "hiddenSize": 6, "numLayers": 1}
    assert one(nn.RReLU(0.1, 0.3), x1())["params"] == {"negativeSlope": pytest.approx(0.2)}
    assert one(nn.ConvTranspose1d(4, 6, 3, stride=2), x1())["params"] == {
        "inChannels": 4, "outChannels": 6, "kernelSize": 3, "stride": 2, "padding": 0, "outputPadding": 0}
    bilinear = one(nn.Bilinear(4, 5, 3), (torch.randn(2, 4), torch.randn(2, 5)))
    assert bilinear["params"] == {"className": "Bilinear", "paramCount": 3 * 4 * 5 + 3}
    assert one(nn.Unfold(2), x2())["params"] == {"className": "Unfold", "paramCount": 0}
