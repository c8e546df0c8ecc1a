"""The shape functions of neurarch_trace.metakernels against PyTorch's own meta kernels.

Every answer the shortcuts give must be PyTorch's, to the stride and the storage byte, over dtypes,
ranks, memory formats, size-one dimensions and flags; errors stay PyTorch's; and the tracer and the
rehearsal really use them (a ResNet-style block traced on meta).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import neurarch_trace.metakernels as metakernels
from neurarch_trace import trace_model
from neurarch_trace.metakernels import MetaKernels, worth_a_mode

aten = torch.ops.aten
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SHAPES = ((2, 8), (4, 8, 5), (1, 8, 1), (2, 8, 7, 7), (1, 8, 7, 7), (2, 8, 1, 1), (1, 8, 1, 1), (2, 8, 3, 4, 5),
          (1, 8, 1, 1, 1), (3, 1, 4, 4))
#: The fast path's sweep: ranks 3 and 4, a batch of one, every layout, bfloat16 (the slow one: all).
SWEEPS = [pytest.param(SHAPES[1:2] + SHAPES[3:5], DTYPES[1:2], id="fast"),
          pytest.param(SHAPES, DTYPES, id="full", marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def fresh_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test checks its classes from the start (the verdicts are kept per process)."""
    monkeypatch.setattr(metakernels, "_VERIFIED", {})


def _layouts(shape: tuple, dtype: torch.dtype):
    """A contiguous tensor, a channels-last one (4-d, 5-d) and one with its last two dims swapped."""
    yield torch.empty(shape, dtype=dtype, device="meta")
    if len(shape) == 4:
        yield torch.empty(shape, dtype=dtype, device="meta").to(memory_format=torch.channels_last)
    if len(shape) == 5:
        yield torch.empty(shape, dtype=dtype, device="meta").to(memory_format=torch.channels_last_3d)
    if len(shape) >= 3:
        swapped = shape[:-2] + (shape[-1], shape[-2])
        yield torch.empty(swapped, dtype=dtype, device="meta").transpose(-1, -2)


def _metadata(out):
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.stride(), out.dtype, out.device.type, out.storage_offset(),
                out.untyped_storage().nbytes())
    if isinstance(out, (tuple, list)):
        return tuple(_metadata(item) for item in out)
    return out


def _outcome(call):
    try:
        return _metadata(call())
    except Exception as exc:  # noqa: BLE001 - the error's type is part of the answer
        return ("raises", type(exc))


class Checker:
    """Calls each case three times through one MetaKernels (the class's check, then answers) and
    compares every answer with PyTorch's kernel called directly."""

    def __init__(self) -> None:
        self.kernels = MetaKernels()
        self.cases = 0

    def check(self, func, *args) -> None:
        expected = _outcome(lambda: func(*args))
        for _ in range(3):
            assert _outcome(lambda: self.kernels.call(func, args, {})) == expected, (func, args)
        self.cases += 1


@pytest.mark.parametrize("shapes, dtypes", SWEEPS)
def test_batch_norm_answers_are_pytorchs_to_the_byte(shapes: tuple, dtypes: tuple) -> None:
    checker = Checker()
    for shape, dtype in itertools.product(shapes, dtypes):
        channels = shape[1]
        for x in _layouts(shape, dtype):
            for weight_dtype, training, stats in itertools.product((None, torch.float32, dtype), (True, False),
                                                                  (True, False)):
                weight = None if weight_dtype is None else torch.empty(channels, dtype=weight_dtype, device="meta")
                running = torch.empty(channels, dtype=weight_dtype or torch.float32, device="meta") if stats else None
                checker.check(aten.native_batch_norm.default, x, weight, weight, running, running, training, 0.1,
                              1e-5)
                for grad in (torch.empty(shape, dtype=dtype, device="meta"), x):
                    for mask in ([True, True, True], [True, False, False], [False, True, True]):
                        checker.check(aten.native_batch_norm_backward.default, grad, x, weight, running, running,
                                      running, running, training, 1e-5, mask)
    assert checker.cases == {1: 672, 4: 8736}[len(dtypes)]
    assert checker.kernels.shortcuts > checker.cases // 2  # most classes are PyTorch's rule


@pytest.mark.parametrize("shapes, dtypes", SWEEPS)
def test_layer_norm_gelu_and_relu_backward_answers_are_pytorchs_to_the_byte(shapes: tuple, dtypes: tuple) -> None:
    checker = Checker()
    for shape, dtype in itertools.product(shapes, dtypes):
        for x in _layouts(shape, dtype):
            checker.check(aten.gelu.default, x)
            for grad in (torch.empty(x.shape, dtype=dtype, device="meta"), x):
                checker.check(aten.gelu_backward.default, grad, x)
                checker.check(aten.threshold_backward.default, grad, x, 0)
            for k in range(1, len(shape) + 1):
                normalized = list(x.shape[-k:])
                stats = aten.native_layer_norm.default(x, normalized, None, None, 1e-5)
                for weight_dtype in (None, torch.float32, dtype):
                    weight = None if weight_dtype is None else torch.empty(normalized, dtype=weight_dtype,
                                                                           device="meta")
                    checker.check(aten.native_layer_norm.default, x, normalized, weight, weight, 1e-5)
                    for mask in ([True, True, True], [True, False, False], [False, True, True]):
                        checker.check(aten.native_layer_norm_backward.default, x.clone(), x, normalized, stats[1],
                                      stats[2], weight, weight, mask)
    assert checker.kernels.shortcuts > checker.cases // 4  # the transposed layouts are left to PyTorch


def test_malformed_calls_get_pytorchs_errors() -> None:
    kernels = MetaKernels()
    x = torch.empty(2, 8, 4, 4, device="meta")
    six = torch.empty(6, device="meta")
    eight = torch.empty(8, device="meta")
    for _ in range(2):  # the second call would be answered if the first had verified a class
        with pytest.raises(RuntimeError):  # six running statistics for eight channels
            kernels.call(aten.native_batch_norm.default, (x, six, six, six, six, False, 0.1, 1e-5), {})
        with pytest.raises(ZeroDivisionError):  # one value per channel while training: PyTorch's meta error
            kernels.call(aten.native_batch_norm.default,
                         (torch.empty(1, 8, device="meta"), eight, eight, eight, eight, True, 0.1, 1e-5), {})
        with pytest.raises(RuntimeError):  # a normalized shape that is not the input's last dims
            kernels.call(aten.native_layer_norm.default, (x, [5], None, None, 1e-5), {})
    assert kernels.shortcuts == 0


def test_a_class_whose_rule_differs_is_left_to_pytorch() -> None:
    """LayerNorm of a tensor with its last two dims swapped: PyTorch's output is contiguous, the
    shortcut's rule (like the input) is not; after the check, every call goes to PyTorch."""
    kernels = MetaKernels()
    x = torch.empty(4, 5, 6, device="meta").transpose(-1, -2)
    for size in (4, 7, 9):
        y = torch.empty(size, 5, 6, device="meta").transpose(-1, -2)
        out = kernels.call(aten.native_layer_norm.default, (y, [6, 5], None, None, 1e-5), {})
        assert out[0].is_contiguous() and tuple(out[0].shape) == (size, 6, 5)
    assert kernels.shortcuts == 0
    assert list(metakernels._VERIFIED.values()) == [False]
    del x


def test_answers_are_fresh_tensors() -> None:
    kernels = MetaKernels()
    x = torch.empty(2, 8, 7, 7, device="meta")
    weight = torch.empty(8, device="meta")
    for _ in range(2):
        out, mean, invstd = kernels.call(aten.native_batch_norm.default,
                                         (x, weight, weight, weight, weight, True, 0.1, 1e-5), {})
    assert kernels.shortcuts == 1
    storages = {id(t.untyped_storage()) for t in (x, weight, out, mean, invstd)}
    assert len(storages) == 5


class _Block(nn.Module):
    """conv-BN-ReLU twice with a residual add, as a ResNet block (channels-last input)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.head(nn.functional.gelu(self.norm(y.mean((2, 3)))))


def test_the_meta_trace_and_its_rehearsal_use_them_and_measure_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A meta trace with its rehearsed step gives the same graph, every measured byte included,
    with the shortcuts and without them (PyTorch's meta kernels throughout)."""
    with torch.device("meta"):
        torch.manual_seed(0)
        model = _Block()
    x = torch.empty(4, 16, 12, 12, device="meta").to(memory_format=torch.channels_last)
    used = []
    original = MetaKernels.call

    def counted(self, func, args, kwargs):
        before = self.shortcuts
        out = original(self, func, args, kwargs)
        if self.shortcuts > before:
            used.append(str(func))
        return out

    monkeypatch.setattr(MetaKernels, "call", counted)
    fast = trace_model(model, x)
    assert {"aten.native_batch_norm.default", "aten.native_batch_norm_backward.default",
            "aten.threshold_backward.default"} <= set(used)
    assert "error" not in fast["measured"]["training"]
    monkeypatch.setattr(metakernels, "SHORTCUTS", {})
    used.clear()
    slow = trace_model(model, x)
    assert used == []
    assert fast == slow


def test_the_mode_is_used_only_where_a_layer_calls_a_shortcut() -> None:
    """A forward pays the mode's trip through Python per operation only when a layer of the model
    runs an operation it answers (a subclass of one included)."""

    class MyNorm(nn.LayerNorm):
        pass

    assert worth_a_mode(_Block().modules())
    assert worth_a_mode(nn.Sequential(nn.Linear(4, 4), MyNorm(4)).modules())
    assert worth_a_mode([nn.GELU()]) and worth_a_mode([nn.SyncBatchNorm(3)])
    assert not worth_a_mode(nn.Sequential(nn.Linear(4, 4), nn.SiLU(), nn.GroupNorm(2, 4)).modules())
