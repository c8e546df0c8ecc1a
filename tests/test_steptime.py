"""The step time (planner/steptime.py): the operators each rehearsed step dispatches, and a step
that takes the longer of its compute and their eager dispatch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan
from neurarch_trace.planner.cost import CONV_MFU, MFU
from neurarch_trace.planner.gpus import gpu_table
from neurarch_trace.planner.steptime import EAGER_OPERATOR_SECONDS, step_operators, step_time
from neurarch_trace.rehearsal.step import InputPlan, Rehearsal

transformers = pytest.importorskip("transformers")

TOKENS = 24


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def lora_graph() -> dict:
    return trace_model(_llama(), torch.zeros(1, TOKENS, dtype=torch.long, device="meta"), finetune="lora")


class _Count(TorchDispatchMode):
    """Counts every aten call that reaches it: under the rehearsal's own modes, it sees what they
    pass on, once each."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_the_operators_are_every_aten_call_of_the_step_whatever_the_batch() -> None:
    model = _llama().train()
    rehearsal = Rehearsal(model, InputPlan((torch.zeros(1, TOKENS, dtype=torch.long, device="meta"),), {}, 1, None))
    counts = []
    for batch in (2, 8):
        below = _Count()
        with below:  # pushed first, so the step's own modes pass every call down to it
            run = rehearsal.run(batch, TOKENS, layers=False)
        counts.append(run.operators)
        # the tracker counts from the forward on; what reaches the mode below includes the few
        # calls that made the inputs and registered the states, before the step
        assert 0 < below.calls - run.operators < 20
    assert counts[0] == counts[1] > 500  # batch-independent


def test_each_rehearsed_step_has_its_own_count(lora_graph: dict) -> None:
    training = lora_graph["measured"]["training"]
    ops = step_operators(training)
    assert ops.count("full", False) == training["operators"]
    assert ops.count("full", True) == training["checkpointed"]["operators"]
    lora = training["adapters"]["lora"]
    assert ops.count("lora", False) == lora["operators"] and ops.count("lora", True) == lora["checkpointedOperators"]
    # checkpointing recomputes each layer's forward; LoRA adds its adapters' calls
    assert ops.count("full", True) > ops.count("full", False)
    assert ops.count("lora", False) > ops.count("full", False)
    # a step not rehearsed takes the count of the step it adds operators to, a lower bound: QLoRA
    # (not rehearsed for a LoRA trace) full training's, with checkpointing its checkpointed step's
    assert ops.count("qlora", False) == ops.count("full", False)
    assert ops.count("qlora", True) == ops.count("full", True)
    no_ckpt = step_operators({k: v for k, v in training.items() if k != "checkpointed"})
    assert no_ckpt.count("full", True) == ops.count("full", False)
    assert step_operators({"error": "no step"}).count("full", False) is None
    assert step_operators({}).count("lora", True) is None


def test_a_small_step_is_bound_by_its_dispatch_and_the_card_says_so(lora_graph: dict) -> None:
    out = make_plan(lora_graph, gpu="H100")
    training = out["plan"]["cost"]["training"]
    operators = lora_graph["measured"]["training"]["operators"]
    batch = out["plan"]["fit"]["batch"]
    h100 = gpu_table().by_id("H100")
    compute = training["flops"] / training["samples"] * batch / (h100.peak_tflops * 1e12 * MFU)
    assert training["bound"] == "dispatch" and training["stepBatch"] == batch
    assert training["operators"] == operators
    assert training["stepSeconds"] == training["dispatchSeconds"] == pytest.approx(operators * 12.9e-6, rel=1e-12)
    assert training["computeSeconds"] == pytest.approx(compute, rel=1e-9)
    assert training["computeSeconds"] < training["stepSeconds"]
    # a unit of training takes samples / batch such steps
    assert training["gpuHours"] == pytest.approx(training["samples"] / batch * training["stepSeconds"] / 3600,
                                                 rel=1e-12)
    assert training["usd"] == pytest.approx(training["gpuHours"] * 3.95, rel=1e-12)
    text = " ".join(line.strip("| ").strip() for line in out["text"].splitlines())
    assert f"ms steps at batch {batch:,}, bound by {operators:,} eager operators x 12.9 us, $3.95/h" in text


def test_a_large_step_is_bound_by_its_compute(lora_graph: dict) -> None:
    # 600,000 tokens a sample: the step's FLOPs outweigh its dispatch, and the cost is as before
    out = make_plan(lora_graph, gpu="H100", seq_len=600_000)
    training = out["plan"]["cost"]["training"]
    assert training["bound"] == "compute" and training["computeSeconds"] > training["dispatchSeconds"] > 0
    h100 = gpu_table().by_id("H100")
    assert training["gpuHours"] == pytest.approx(training["flops"] / (h100.peak_tflops * 1e12 * MFU) / 3600,
                                                 rel=1e-12)
    assert "at 40% of 989.4 TFLOPS bf16" in out["text"]


def test_a_graph_without_operators_is_timed_by_compute_alone_and_says_so(lora_graph: dict) -> None:
    old = copy.deepcopy(lora_graph)
    for entry in (old["measured"]["training"], old["measured"]["training"]["checkpointed"],
                  *old["measured"]["training"]["adapters"].values()):
        if isinstance(entry, dict):
            for key in ("operators", "checkpointedOperators"):
                entry.pop(key, None)
    out = make_plan(old, gpu="H100")
    training = out["plan"]["cost"]["training"]
    assert (training["bound"], training["dispatchSeconds"], training["operators"]) == (None, None, None)
    assert training["stepSeconds"] == training["computeSeconds"]
    assert "at 40% of 989.4 TFLOPS bf16 (eager dispatch not counted)" in " ".join(
        line.strip("| ").strip() for line in out["text"].splitlines())


def test_step_time_arithmetic() -> None:
    t4 = gpu_table().by_id("T4")
    step = step_time(1e12, 4, t4, CONV_MFU, 1_000)
    assert step.compute == pytest.approx(4e12 / (65e12 * 0.2)) and step.dispatch == pytest.approx(1_000 * 12.9e-6)
    assert (step.seconds, step.bound) == (step.compute, "compute")
    assert step_time(1e6, 1, t4, MFU, 1_000).bound == "dispatch"
    assert step_time(1e6, 1, t4, MFU, None).dispatch == 0.0 and step_time(1e6, 1, t4, MFU, None).bound is None
    assert EAGER_OPERATOR_SECONDS == 12.9e-6
    with pytest.raises(ValueError, match="at least one sample"):
        step_time(1e6, 0, t4, MFU, 10)


def test_a_diff_times_both_models_alike(lora_graph: dict) -> None:
    # the same model, its base traced by an older tool (no operator counts): the cost delta is 0,
    # both timed by compute alone, not one by its dispatch and the other without
    old = copy.deepcopy(lora_graph)
    del old["measured"]["training"]["operators"]
    out = make_plan(lora_graph, base=old, gpu="H100")
    diff = out["plan"]["diff"]
    assert diff["costUsd"]["delta"] == 0.0 and diff["costTiming"] == "compute"
    assert "cost: both timed by compute alone (one graph has no operator counts" in " ".join(
        line.strip("| ").strip() for line in out["text"].splitlines())
    same = make_plan(lora_graph, base=copy.deepcopy(lora_graph), gpu="H100")["plan"]
    assert same["diff"]["costUsd"]["delta"] == 0.0
    assert same["diff"]["costUsd"]["new"] == pytest.approx(same["cost"]["training"]["usd"], rel=1e-12)
    assert "costTiming" not in same["diff"]


def test_a_diff_counts_a_rehearsed_lora_step_against_a_floor_alike(lora_graph: dict) -> None:
    # the base is the same model traced without --finetune: it has full training's count only, a
    # floor under LoRA, while the new graph rehearsed the LoRA step itself. Both are timed with the
    # count both rehearsed (full training's), so the same model costs the same
    base = copy.deepcopy(lora_graph)
    del base["measured"]["training"]["adapters"]
    training = lora_graph["measured"]["training"]
    assert training["adapters"]["lora"]["operators"] > training["operators"] > 0
    out = make_plan(lora_graph, base=base, finetune="lora", gpu="H100")
    plan, diff = out["plan"], out["plan"]["diff"]
    assert plan["cost"]["training"]["operators"] == training["adapters"]["lora"]["operators"]  # the card's own
    assert diff["costTiming"] == "full"
    new_alone = make_plan(lora_graph, base=lora_graph, finetune="lora", gpu="H100")["plan"]["diff"]
    assert "costTiming" not in new_alone
    floor = make_plan(base, finetune="lora", gpu="H100")["plan"]["cost"]["training"]
    assert floor["operators"] == training["operators"]
    assert diff["costUsd"]["base"] == pytest.approx(floor["usd"], rel=1e-12)
    assert "cost: both steps' eager operators counted as in full training, which both graphs rehearsed" in " ".join(
        line.strip("| ").strip() for line in out["text"].splitlines())


def test_a_cluster_bound_by_dispatch_says_its_batch_is_per_gpu(lora_graph: dict) -> None:
    # on 2 GPUs each runs its own step: the step's batch is each GPU's, and the card says so
    out = make_plan(lora_graph, gpu="H100x2")
    training = out["plan"]["cost"]["training"]
    assert training["gpus"] == 2 and training["bound"] == "dispatch"
    assert training["stepBatch"] == out["plan"]["fit"]["batch"]
    text = " ".join(line.strip("| ").strip() for line in out["text"].splitlines())
    assert f"ms steps at batch {training['stepBatch']:,} per GPU, bound by {training['operators']:,} eager" in text
    one = make_plan(lora_graph, gpu="H100")
    assert "per GPU, bound by" not in " ".join(line.strip("| ").strip() for line in one["text"].splitlines())
