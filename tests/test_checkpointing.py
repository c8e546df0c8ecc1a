"""Activation checkpointing rehearsed as transformers applies it (rehearsal/checkpointing.py): the
same memory curve as transformers' own ``gradient_checkpointing_enable()``, what a checkpointed
layer keeps, and how the plan uses the checkpointed LoRA/QLoRA steps."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan
from neurarch_trace.planner.analysis import analyse
from neurarch_trace.planner.blocks import find_blocks
from neurarch_trace.planner.finetune import tuning
from neurarch_trace.planner.strategy import footprint
from neurarch_trace.rehearsal import step as step_module
from neurarch_trace.rehearsal.adapters import RECIPES
from neurarch_trace.rehearsal.checkpointing import checkpointed_layers
from neurarch_trace.rehearsal.step import InputPlan, Rehearsal, RehearsalError

transformers = pytest.importorskip("transformers")

HIDDEN, INTER, LAYERS, HEADS, VOCAB = 64, 160, 3, 4, 512
BATCH, TOKENS = 2, 24


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=2, vocab_size=VOCAB)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return model.train()


def _plan(scalars: list | None = None) -> InputPlan:
    return InputPlan((torch.zeros(1, TOKENS, dtype=torch.long, device="meta"),), {}, 1, scalars)


def _recipe(name: str):
    return None if name == "full" else next(r for r in RECIPES if r.name == name)


def _peak(run) -> int:
    return max(sum(point) for point in run.points)


def _phase_peaks(run) -> dict:
    peaks: dict = {}
    for point, phase in zip(run.points, run.phases):
        peaks[phase] = max(peaks.get(phase, 0), sum(point))
    return peaks


def test_the_layers_checkpointed_are_transformers_own() -> None:
    model = _llama()
    assert checkpointed_layers(model) == list(model.model.layers)
    # a model transformers does not checkpoint: no layer, and a checkpointed step is refused
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    assert checkpointed_layers(plain) == []
    with pytest.raises(RehearsalError, match="no layer transformers checkpoints"):
        Rehearsal(plain, InputPlan((torch.zeros(2, 4, device="meta"),), {}, 2)).run(2, None, checkpoint=True)


@pytest.mark.parametrize("recipe", ["full", "lora", "qlora", "qloraKbit"])
def test_the_step_is_the_one_transformers_own_checkpointing_runs(recipe: str, monkeypatch) -> None:
    # ours: each decoder layer's forward under torch.utils.checkpoint, the cache off inside it
    ours = Rehearsal(_llama(), _plan(), recipe=_recipe(recipe)).run(BATCH, TOKENS, layers=False, checkpoint=True)
    # theirs: transformers' gradient_checkpointing_enable() on the model, with the rehearsal's
    # recompute context (the meta device and its autocast), and none of ours installed
    model = _llama()
    recompute: list = []

    @contextlib.contextmanager
    def record(model: nn.Module, make) -> object:
        recompute.append(make)
        yield

    monkeypatch.setattr(step_module, "checkpointing_installed", record)
    kwargs = {"use_reentrant": False, "preserve_rng_state": False,
              "context_fn": lambda: (contextlib.nullcontext(), recompute[-1]())}
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # transformers turns the cache off for the whole model, whose causal mask then checks for packed
    # sequences (one value read: none are packed); ours turns it off inside each layer, as
    # transformers also does, and the mask sees the (empty) cache: the same tensors besides
    theirs = Rehearsal(model, _plan([True]), recipe=_recipe(recipe)).run(BATCH, TOKENS, layers=False,
                                                                          checkpoint=True)
    # each phase's peak, to the byte
    assert _phase_peaks(ours) == _phase_peaks(theirs)
    plain = Rehearsal(_llama(), _plan(), recipe=_recipe(recipe)).run(BATCH, TOKENS, layers=False)
    assert _peak(ours) < _peak(plain)


def test_a_checkpointed_layer_saves_nothing_in_the_forward_and_the_model_is_left_as_it_was() -> None:
    model = _llama()
    run = Rehearsal(model, _plan(), recipe=_recipe("lora")).run(BATCH, TOKENS, checkpoint=True)
    # torch.utils.checkpoint saves each layer's positional inputs (the bfloat16 residual stream of
    # a 16-bit base), and nothing inside the layer
    for i in range(LAYERS):
        assert run.saved[f"model.layers.{i}"] == [BATCH * TOKENS * HIDDEN * 2]
    inside = {q: calls for q, calls in run.saved.items() if q.startswith("model.layers.") and q.count(".") > 2}
    assert inside and all(sum(calls) == 0 for calls in inside.values())
    # outside the layers the step saves what it did: the final norm keeps its float32 input
    plain = Rehearsal(_llama(), _plan(), recipe=_recipe("lora")).run(BATCH, TOKENS)
    assert run.saved["model.norm"] == plain.saved["model.norm"] != [0]
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(not getattr(m, "gradient_checkpointing", False) for m in model.modules())


@pytest.fixture(scope="module")
def qlora_graph() -> dict:
    model = _llama().eval()
    return trace_model(model, torch.zeros(1, TOKENS, dtype=torch.long, device="meta"), finetune="qlora")


def test_each_recipe_is_rehearsed_with_checkpointing_too(qlora_graph: dict) -> None:
    adapters = qlora_graph["measured"]["training"]["adapters"]
    for name in ("qlora", "qloraKbit"):
        assert 0 < adapters[name]["checkpointedPerSampleBytes"] < adapters[name]["perSampleBytes"], name
    # run again at two batches here: the growth per sample is the graph's
    rehearsal = Rehearsal(_llama(), _plan(), recipe=_recipe("qloraKbit"))
    one, two = (rehearsal.run(b, TOKENS, layers=False, checkpoint=True) for b in (2, 4))
    assert adapters["qloraKbit"]["checkpointedPerSampleBytes"] == (_peak(two) - _peak(one)) / 2


def test_the_plan_sizes_a_checkpointed_setup_from_the_checkpointed_step(qlora_graph: dict) -> None:
    def peak(graph: dict, kbit: bool) -> float:
        a = analyse(graph, seq_len=TOKENS)
        step = tuning(a, find_blocks(a.structure, a.structure_counts), "qlora")
        states, acts = step.kbit if kbit else (step.states, step.acts)
        return footprint(states, acts, "single", 1, True).peak_bytes(8)

    for name, kbit in (("qlora", False), ("qloraKbit", True)):
        bigger = copy.deepcopy(qlora_graph)
        bigger["measured"]["training"]["adapters"][name]["checkpointedPerSampleBytes"] += 1e6
        # one MB more per sample with checkpointing: 8 MB more at batch 8, nothing else moves
        assert peak(bigger, kbit) - peak(qlora_graph, kbit) == pytest.approx(8e6, rel=1e-9), name


def test_the_card_says_a_checkpointed_setup_was_rehearsed(qlora_graph: dict) -> None:
    # 1.1 million tokens: batch 1 fits a T4 only with checkpointing
    out = make_plan(qlora_graph, finetune="qlora", gpu="T4", seq_len=1_100_000)
    plan = out["plan"]
    assert plan["fit"]["checkpointing"] is True
    assert plan["finetune"]["activations"] == "rehearsed"
    kbit = plan["finetune"]["kbit"]
    assert kbit["checkpointing"] is True and kbit["checkpointedPeakGb"] is None
    text = " ".join(line.strip("| ").strip() for line in out["text"].splitlines())
    assert f"at batch {kbit['batch']:,}, with checkpointing (rehearsed)" in text
    # a graph rehearsed without checkpointing (before it was): sized from full training's, and said
    old = copy.deepcopy(qlora_graph)
    for name in ("qlora", "qloraKbit"):
        del old["measured"]["training"]["adapters"][name]["checkpointedPerSampleBytes"]
    before = make_plan(old, finetune="qlora", gpu="T4", seq_len=1_100_000)["plan"]
    assert before["fit"]["checkpointing"] is True
    assert before["finetune"]["activations"] == "rehearsed, checkpointing from full training"
    assert before["finetune"]["kbit"] is None


def test_finetune_without_a_plan_writes_the_rehearsed_steps_for_a_later_plan(tmp_path, capfd) -> None:
    # the graph a later `plan FILE --finetune qlora` sizes from: before, --finetune needed --plan
    from helpers import run_cli

    (tmp_path / "tiny.py").write_text(
        "import transformers\n"
        "def build():\n"
        f"    c = transformers.LlamaConfig(hidden_size={HIDDEN}, intermediate_size={INTER}, "
        f"num_hidden_layers={LAYERS}, num_attention_heads={HEADS}, num_key_value_heads=2, vocab_size={VOCAB})\n"
        "    return transformers.LlamaForCausalLM(c)\n")
    code, out, err = run_cli(["tiny.py:build", "--input", f"1,{TOKENS}:long", "--finetune", "QLoRA",
                              "-o", "g.neurarch.json"], tmp_path, capfd)
    assert code == 0 and err.startswith("wrote g.neurarch.json (") and err.count("\n") == 1
    import json
    adapters = json.loads((tmp_path / "g.neurarch.json").read_text())["measured"]["training"]["adapters"]
    assert set(adapters) == {"rank", "layers", "qlora", "qloraKbit"}
    assert all(adapters[r]["checkpointedPerSampleBytes"] > 0 for r in ("qlora", "qloraKbit"))
    # the other sizing options still need a plan
    code, out, err = run_cli(["tiny.py:build", "--input", f"1,{TOKENS}:long", "--gpu", "T4"], tmp_path, capfd)
    assert (code, err) == (1, "neurarch-trace: --gpu needs --plan or --share: it sizes the plan\n")


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_ctrl_c_during_a_rehearsed_step_stops_it(phase: str, monkeypatch) -> None:
    # a new-user pass: Ctrl-C that landed in a storage's weakref finaliser was printed as "Exception
    # ignored" and the step went on, its memory curve missing a free, and the graph was written
    import signal

    from neurarch_trace.rehearsal import rehearse_training_step, storage

    start = storage.StorageTracker.start

    def interrupted(self, name: str) -> None:
        start(self, name)
        if name == phase:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(storage.StorageTracker, "start", interrupted)
    ids = torch.zeros(1, TOKENS, dtype=torch.long, device="meta")
    with pytest.raises(KeyboardInterrupt):
        rehearse_training_step(_llama(), (ids,), batch_size=1, finetune="qlora")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_is_held_until_the_next_operation() -> None:
    # what makes the above hold wherever the signal lands: Python raises KeyboardInterrupt in the
    # code that runs when it arrives, which may be a finaliser that swallows it
    import signal

    from neurarch_trace.rehearsal.storage import StorageTracker

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with StorageTracker():
            signal.raise_signal(signal.SIGINT)
            reached.append("after the signal")
            torch.empty(4, device="meta") + 1
            reached.append("after the next operation")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_diff_says_when_the_base_step_comes_from_elsewhere(qlora_graph: dict) -> None:
    # a new-user pass: the same model traced without --finetune read "Peak memory -0.4 GB" beside
    # "0 added, 0 removed, 0 changed", with nothing to say why
    base = copy.deepcopy(qlora_graph)
    del base["measured"]["training"]["adapters"]
    out = make_plan(qlora_graph, base=base, finetune="QLoRA", gpu="T4")  # any case, as on the command line
    diff = out["plan"]["diff"]
    assert diff["activations"] == {"new": "rehearsed", "base": "full training"}
    assert diff["layers"]["added"] == diff["layers"]["removed"] == diff["layers"]["changed"] == []
    text = " ".join(line.strip("| ").strip() for line in out["text"].splitlines())
    assert "activations: the new one's rehearsed, the base's from full training's step (traced without --finetune)" \
        in text
    # the same graph as its own base: nothing to say
    same = make_plan(qlora_graph, base=qlora_graph, finetune="qlora", gpu="T4")
    assert same["plan"]["diff"]["peakGb"]["delta"] == 0
    assert "activations:" not in same["text"]


@pytest.fixture(scope="module")
def full_graph() -> dict:
    return trace_model(_llama().eval(), torch.zeros(1, TOKENS, dtype=torch.long, device="meta"))


def test_full_training_is_rehearsed_with_checkpointing_too(full_graph: dict) -> None:
    training = full_graph["measured"]["training"]
    checkpointed = training["checkpointed"]
    assert checkpointed["batchSizes"] == [2, 4]
    phases = {peak["phase"] for peak in checkpointed["peaks"]}
    assert {"forward", "backward", "optimizer"} <= phases
    # checkpointing keeps fewer activations per sample than the plain step, with the same weights
    assert checkpointed["activationBytesPerSample"] < training["activationBytesPerSample"]
    forward = max((p for p in checkpointed["peaks"] if p["phase"] == "forward"),
                  key=lambda p: sum(p["perSampleBytes"].values()))
    plain = max((p for p in training["peaks"] if p["phase"] == "forward"),
                key=lambda p: sum(p["perSampleBytes"].values()))
    assert sum(forward["perSampleBytes"].values()) < sum(plain["perSampleBytes"].values())
    # a model transformers does not checkpoint has no such step
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    assert "checkpointed" not in trace_model(model, torch.randn(2, 8))["measured"]["training"]


def test_the_plan_sizes_checkpointed_full_training_from_the_rehearsed_step(full_graph: dict) -> None:
    a = analyse(full_graph, seq_len=TOKENS)
    step = tuning(a, find_blocks(a.structure, a.structure_counts), "full")
    for batch in (1, 8, 64):
        # the largest of the checkpointed step's own phase peaks, read from the graph, plus the
        # plan's 1 GB framework allowance
        expected = max(sum(p["stateBytes"].values()) + batch * sum(p["perSampleBytes"].values())
                       for p in full_graph["measured"]["training"]["checkpointed"]["peaks"]) + 1e9
        assert footprint(step.states, step.acts, "single", 1, True, step.others).peak_bytes(batch) == \
            pytest.approx(expected, rel=1e-12)
    # without the checkpointed step (a graph traced before), checkpointing is sized from the layers
    old = copy.deepcopy(full_graph)
    del old["measured"]["training"]["checkpointed"]
    a = analyse(old, seq_len=TOKENS)
    step = tuning(a, find_blocks(a.structure, a.structure_counts), "full")
    assert step.acts.checkpointed is not None and step.acts.checkpointed_phases == ()


def test_the_card_names_the_checkpointed_steps_peak(full_graph: dict) -> None:
    # 1.5 million tokens: batch 1 fits a T4 only with checkpointing
    out = make_plan(full_graph, gpu="T4", seq_len=1_500_000)
    plan = out["plan"]
    assert plan["fit"]["checkpointing"] is True and plan["memory"]["checkpointed"] is True
    peaks = analyse(full_graph, seq_len=1_500_000).memory.checkpointed_phases
    batch = plan["fit"]["batch"]
    assert plan["memory"]["peakPhase"] == max(peaks, key=lambda p: p.bytes(batch)).phase
    text = " ".join(line.strip("| ").strip() for line in out["text"].splitlines())
    assert f"measured: rehearsed checkpointed step, peak in the {plan['memory']['peakPhase']}" in text
    # an eager what-if on this SDPA trace: checkpointing sized from the layers, and said
    eager = make_plan(full_graph, gpu="T4", seq_len=15_000, attention="eager")  # the scores grow squared
    assert eager["plan"]["fit"]["checkpointing"] is True and eager["plan"]["memory"]["checkpointed"] is False
    assert "measured: rehearsed step, checkpointing sized from its layers, peak in the" in " ".join(
        line.strip("| ").strip() for line in eager["text"].splitlines())
    # without checkpointing the card names the plain step's
    plain = make_plan(full_graph, gpu="T4")
    assert plain["plan"]["fit"]["checkpointing"] is False and "checkpointed" not in plain["plan"]["memory"]
    assert "measured: rehearsed step, peak in the" in plain["text"]


def test_the_smallest_cluster_reads_the_checkpointed_steps_own_states() -> None:
    # a new-user pass: a 70B plan on a T4 never returned. The cluster search took the plain step's
    # states to find what ZeRO-3 leaves undivided, and the rehearsed checkpointed phases hold others
    from neurarch_trace.planner.fit import smallest_cluster
    from neurarch_trace.planner.gpus import gpu_table
    from neurarch_trace.planner.strategy import Activations, States

    t4 = gpu_table().by_id("T4")
    plain = States(weights=1e9, master=2e9, gradients=0.0, zero_gradients=0.0, optimizer=4e9, buffers=0.0,
                   framework=1e9, gather=1e8)
    # the checkpointed step peaks in the optimizer step, every gradient alive, and one sample's
    # activations alone nearly fill the card
    held = States(weights=140e9, master=280e9, gradients=280e9, zero_gradients=140e9, optimizer=600e9,
                  buffers=0.0, framework=1e9, gather=2e9)
    for per_sample, holds in ((9e9, True), (13e9, False)):
        acts = Activations(50e9, per_sample, ((held, Activations(per_sample, per_sample)),))
        n, setup = smallest_cluster(plain, acts, t4)
        if not holds:  # 1 + 2 + 13 GB, x 1.15, over 16 GB: no number of T4s holds one sample
            assert n is None
            continue
        assert setup.peak_bytes(1) * 1.15 <= t4.memory_bytes
        # in whole 8-GPU nodes, as the planner counts clusters: one node fewer does not hold it
        assert n % 8 == 0
        assert footprint(plain, acts, "zero3", n - 8, True).peak_bytes(1) * 1.15 > t4.memory_bytes
        # the divided states, 16-bit weights and gradients, master weights and moments, over n cards
        assert setup.peak_bytes(1) == pytest.approx(1e9 + 2e9 + 9e9 + (140e9 + 140e9 + 280e9 + 600e9) / n)


def test_ddp_buckets_and_zero_gradients_hold_every_trainable_parameter(full_graph: dict) -> None:
    # a new-user pass: DDP's buckets counted 0 GB, taken from the phase's gradients, and the step
    # peaks in the backward before most gradients exist. DDP allocates its buckets when it wraps the
    # model (every trainable parameter's gradient, fp32 under autocast) and holds them all along
    a = analyse(full_graph, seq_len=TOKENS)
    step = tuning(a, find_blocks(a.structure, a.structure_counts), "full")
    trainable = sum(p.numel() for p in _llama().parameters())
    assert a.counts.trainable == trainable
    single = footprint(step.states, step.acts, "single", 1, False, step.others)
    ddp = footprint(step.states, step.acts, "ddp", 2, False, step.others)
    for batch in (1, 16, 256):
        assert ddp.at(batch).parts["ddpBuckets"] == 4 * trainable
        assert ddp.peak_bytes(batch) == pytest.approx(single.peak_bytes(batch) + 4 * trainable, rel=1e-12)
    # the gradients themselves are each phase's: none in the forward, all in the optimizer step,
    # which ZeRO keeps in 16 bits (ZeRO-1 whole, ZeRO-2 divided)
    grads = {p.phase: p.state.get("gradients", 0.0) for p in a.memory.phases}
    assert grads["forward"] == 0 and grads["optimizer"] == 4 * trainable
    zero1 = footprint(step.states, step.acts, "zero1", 4, False, step.others)
    zero2 = footprint(step.states, step.acts, "zero2", 4, False, step.others)
    ddp_phases = {round(p.parts["gradients"]) for p in (ddp, *ddp.others)}
    assert {round(p.parts["gradients"]) for p in (zero1, *zero1.others)} == {round(g / 2) for g in ddp_phases}
    assert {round(p.parts["gradients"]) for p in (zero2, *zero2.others)} == {round(g / 8) for g in ddp_phases}
    assert 4 * trainable in ddp_phases
    # and the card's breakdown says so on a cluster that picks DDP
    plan = make_plan(full_graph, gpu="T4x2")["plan"]
    assert plan["fit"]["strategy"] == "ddp"
    assert plan["cost"]["breakdown"]["ddpBucketsGb"] == pytest.approx(4 * trainable / 1e9, rel=1e-12)
