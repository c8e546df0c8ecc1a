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


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode", "grad"])
@pytest.mark.parametrize("batch_first", [True, False])
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
                graph = trace_model(model, (x,), kwargs=kwargs, depth=depth)
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


def test_state_guard_on_the_meta_device():
    with torch.device("meta"):
        model = Mutating()
    graph = trace_model(model, torch.empty(3, 4, device="meta"))
    assert graph["measured"]["params"] == sum(p.numel() for p in model.parameters())
    assert model.norm.calls == 0 and model.norm.steps.is_meta
