"""The user's own hooks see the traced forward, not the rehearsed step's meta calls."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module
from torch.nn.utils import prune

from neurarch_trace import trace_model
from neurarch_trace.rehearsal.user_hooks import is_library_hook, user_hooks_left_out


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_forward_hook_keeps_the_traced_output_not_a_meta_one() -> None:
    model, x = _mlp(), torch.randn(2, 8)
    seen = []
    handle = model[0].register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    graph = trace_model(model, (x,))
    # one call: the traced forward's, with its real values; the step was still rehearsed
    assert len(seen) == 1 and seen[0].device.type == "cpu"
    assert torch.equal(seen[0], model[0](x).detach())
    training = graph["measured"]["training"]
    assert "error" not in training and training["operators"] > 0 and training["peaks"]
    # the handle still works, and the hook is gone once removed
    handle.remove()
    assert not model[0]._forward_hooks


def test_backward_and_global_hooks_do_not_run_in_the_rehearsal() -> None:
    model, x = _mlp(), torch.randn(2, 8)
    backward, every = [], []
    model[2].register_full_backward_hook(lambda m, gi, go: backward.append(go[0].device.type))
    handle = torch_module.register_module_forward_hook(lambda m, i, o: every.append(type(m).__name__))
    try:
        trace_model(model, (x,))
    finally:
        handle.remove()
    # the traced forward runs without autograd: no backward; the global hook saw its 4 module calls
    assert backward == []
    assert every == ["Linear", "ReLU", "Linear", "Sequential"]


def test_the_rehearsed_step_is_the_same_with_a_users_hook() -> None:
    model, x = _mlp(), torch.randn(2, 8)
    plain = trace_model(model, (x,))["measured"]["training"]
    model[0].register_forward_pre_hook(lambda m, i: None)
    model[2].register_forward_hook(lambda m, i, o: None)
    hooked = trace_model(model, (x,))["measured"]["training"]
    assert hooked == plain


def test_hooks_come_back_in_order_with_their_handles_whatever_happens() -> None:
    model = _mlp()
    calls = []
    first = model[0].register_forward_hook(lambda m, i, o: calls.append("user 1"))
    amount = prune.l1_unstructured(model[0], "weight", amount=0.5)  # a forward pre-hook of PyTorch's
    second = model[0].register_forward_hook(lambda m, i, o: calls.append("user 2"))
    pre_before = list(model[0]._forward_pre_hooks.items())
    post_before = list(model[0]._forward_hooks.items())
    with pytest.raises(RuntimeError, match="inside"):
        with user_hooks_left_out(model):
            assert list(model[0]._forward_pre_hooks.items()) == pre_before  # PyTorch's pruning stays
            assert model[0]._forward_hooks == {}
            model(torch.randn(1, 8))
            assert calls == []
            raise RuntimeError("inside")
    assert list(model[0]._forward_pre_hooks.items()) == pre_before
    assert list(model[0]._forward_hooks.items()) == post_before
    model(torch.randn(1, 8))
    assert calls == ["user 1", "user 2"]
    second.remove()
    first.remove()
    assert not model[0]._forward_hooks and amount is model[0]


class _Watcher:
    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        pass

    def method(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        pass


def _user_function(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    pass


def test_which_hooks_are_the_libraries() -> None:
    linear = nn.Linear(2, 2)
    prune.random_unstructured(linear, "weight", amount=0.5)
    (pruning,) = linear._forward_pre_hooks.values()
    assert is_library_hook(pruning)  # torch.nn.utils.prune
    assert is_library_hook(functools.partial(torch.nn.functional.relu))
    assert is_library_hook(nn.Linear(1, 1).forward)  # a bound method of a torch class
    watcher = _Watcher()
    for hook in (_user_function, lambda m, i, o: None, watcher, watcher.method,
                 functools.partial(_user_function), functools.partial(functools.partial(watcher))):
        assert not is_library_hook(hook), hook


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attn(x, x, x)[0])


def test_a_global_hook_sees_a_forward_without_autograd_and_the_graph_is_the_same() -> None:
    # a global forward hook turns the closed forms off (it runs inside every layer), and it turned
    # autograd on for the whole traced forward: an activation store kept graphs alive
    torch.manual_seed(0)
    model, x = _Attention().eval(), torch.randn(2, 5, 16)
    plain = trace_model(model, (x,), training_step=False)
    seen = []
    handle = torch_module.register_module_forward_hook(
        lambda m, i, o: seen.append((type(m).__name__, torch.is_grad_enabled())))
    try:
        hooked = trace_model(model, (x,), training_step=False)
    finally:
        handle.remove()
    # MultiheadAttention runs with autograd (its unfused path, as without the hook); nothing else
    assert seen == [("MultiheadAttention", True), ("Linear", False), ("_Attention", False)]
    assert hooked["components"] == plain["components"] and hooked["connections"] == plain["connections"]
    for key in ("params", "flops", "layerFlops", "functionalFlops", "activationBytes"):
        assert hooked["measured"][key] == plain["measured"][key], key


def test_a_users_hook_that_reshapes_an_output_runs_in_the_step_when_it_must() -> None:
    # without the hook the next layer gets 16 features and not 32: the step fails, and is
    # rehearsed again with the user's hooks in it, as part of the model
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(32, 4)), torch.randn(2, 8)
    devices = []

    def doubled(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        devices.append(output.device.type)
        return torch.cat([output, output], -1)

    model[0].register_forward_hook(doubled)
    graph = trace_model(model, (x,))
    training = graph["measured"]["training"]
    assert "error" not in training and training["operators"] > 0
    # the traced forward first, then the rehearsal's calls on meta tensors
    assert devices[0] == "cpu" and set(devices[1:]) == {"meta"}
