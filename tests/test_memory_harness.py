"""The validation harness (bench/training_memory.py), checked by hand, and against the rehearsal.

The harness runs real training steps on the CPU with CUDA's autocast policy installed at the
dispatcher (bench/cuda_on_cpu.py) and measures the live bytes from the profiler's allocation
events; none of that is the rehearsal's code. Here it is validated to the byte on a small MLP.
"""

from __future__ import annotations

import sys

import pytest
import torch
from helpers import ROOT, load_example
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.planner.analysis import analyse
from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES

sys.path.insert(0, str(ROOT / "bench"))
from cuda_on_cpu import CudaOnCpu  # noqa: E402
from training_memory import _classify, _per_token, measure  # noqa: E402


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))


def _mlp_batch(batch: int) -> tuple:
    return (torch.randn(batch, 784),), torch.randint(0, 10, (batch,))


def test_the_harness_measures_an_mlp_to_the_byte() -> None:
    with CudaOnCpu() as emulation:
        peaks = measure(_mlp(), _mlp_batch, _classify, 8, emulation)
    tensors = {phase: peak["tensors"] for phase, peak in peaks.items()}
    p = 814_120  # 203,530 float32 parameters
    batch = 25_088 + 64  # x, 8*784*4, and the int64 target, 8*8
    steps = 16  # AdamW's four float32 step counts: host memory on a GPU, CPU memory here
    casts = 401_408 + 512 + 5_120 + 20  # bf16 copies of the weights and biases
    # forward, at fc2's output: parameters, moments, the batch, the casts, x as bf16 (12,544), the
    # ReLU's output (4,096), the dropout's output (4,096) and bool mask (2,048), fc2's output (160)
    forward = 3 * p + steps + batch + casts + 12_544 + 4_096 + 4_096 + 2_048 + 160
    assert tensors["forward"] == forward == 2_897_532
    # the loss adds the float32 logits (320), log-probabilities (320), the loss and its weight (4 + 4)
    assert tensors["loss"] == forward + 320 + 320 + 4 + 4
    # backward, at fc1's float32 weight gradient (802,816) while its bf16 gradient (401,408) lives,
    # with fc2's and fc1's other gradients (10,240 + 40 + 1,024), the logits (160), the loss and
    # its gradient (4 + 4); the weight casts are gone
    assert tensors["backward"] == 3 * p + steps + batch + 160 + 8 + 10_240 + 40 + 1_024 + 401_408 + 802_816
    # AdamW: parameters, gradients, moments and one float32 temporary a parameter (_foreach_sqrt)
    assert tensors["optimizer"] == 5 * p + steps + batch + 160 + 4
    # on an AVX-512 CPU, oneDNN's packed GEMM operands (allocations that are no tensor) come and go
    # inside the forward's matrix products; on an AVX2 one it packs nothing (seen on an AMD EPYC)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        assert peaks["forward"]["all"] > peaks["forward"]["tensors"]
    elif capability == "AVX2":
        assert peaks["forward"]["all"] == peaks["forward"]["tensors"]


def test_the_prediction_matches_the_harness_on_the_mlp() -> None:
    """The plan's per-phase peaks against the real step: they differ by the step counts AdamW keeps
    on the host (16 B) and, in the forward, the target the rehearsal makes only for the loss (64 B)."""
    memory = analyse(trace_model(_mlp(), torch.randn(8, 784))).memory
    with CudaOnCpu() as emulation:
        real = measure(_mlp(), _mlp_batch, _classify, 8, emulation)
    for phase, host in (("forward", 16 + 64), ("loss", 16), ("backward", 16), ("optimizer", 16)):
        predicted = max(line.bytes(8) for line in memory.phases if line.phase == phase) - FRAMEWORK_ALLOWANCE_BYTES
        assert real[phase]["tensors"] - predicted == host, phase


@pytest.mark.slow
def test_the_prediction_matches_real_steps_of_a_small_transformer() -> None:
    gpt = load_example("gpt")
    torch.manual_seed(0)
    model = gpt.TinyGPT(gpt.GPTConfig(vocab_size=1024, block_size=64, n_layer=2, n_head=4, n_embd=64))

    def tokens(batch: int) -> tuple:
        ids = torch.randint(0, 1024, (batch, 64))
        return (ids,), ids

    memory = analyse(trace_model(model, torch.randint(0, 1024, (1, 64)))).memory
    with CudaOnCpu() as emulation:
        for batch in (2, 6):
            real = measure(model, tokens, _per_token, batch, emulation)
            for phase in ("forward", "backward", "optimizer"):
                predicted = max(p.bytes(batch) for p in memory.phases if p.phase == phase) - FRAMEWORK_ALLOWANCE_BYTES
                assert predicted == pytest.approx(real[phase]["tensors"], rel=1e-3), (batch, phase)


def test_the_emulation_has_a_policy_for_every_cuda_autocast_op() -> None:
    with CudaOnCpu() as emulation:
        assert emulation.uncovered == []
        x = torch.randn(4, 8, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert nn.functional.linear(x, torch.randn(8, 8)).dtype == torch.bfloat16
            assert nn.functional.layer_norm(x.bfloat16(), (8,)).dtype == torch.float32  # CPU autocast: bf16
            assert torch.softmax(x.bfloat16(), -1).dtype == torch.float32
        assert torch.ops.aten.dropout(x, 0.5, True).requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):  # gone on leaving
        assert nn.functional.layer_norm(x.bfloat16(), (8,)).dtype == torch.bfloat16
