"""The rehearsed training step (neurarch_trace.rehearsal) and the plan made from it.

Byte counts are worked out by hand next to each assertion. Conventions (CUDA mixed precision):
bf16 copies are 2 bytes an element, float32 4, int64 8, bool 1; a Linear under autocast saves the
bf16 copy of its input, a LayerNorm the float32 copy of its input and its float32 mean and rstd;
AdamW(foreach) keeps two float32 moments per parameter and makes one float32 temporary per parameter
(``_foreach_sqrt``) inside ``step()``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import ROOT, load_example, run_cli
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan
from neurarch_trace.planner.analysis import analyse
from neurarch_trace.planner.blocks import find_blocks
from neurarch_trace.planner.finetune import tuning
from neurarch_trace.planner.memory import FRAMEWORK_ALLOWANCE_BYTES
from neurarch_trace.rehearsal import rehearse_training_step
from neurarch_trace.rehearsal.policy import FP32, FP32_SET_OPT_DTYPE, LOWER_PRECISION, PROMOTE

transformers = pytest.importorskip("transformers")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))


def _phase_peak(graph: dict, phase: str, batch: int) -> float:
    """The plan's peak of one phase at ``batch``, less the framework allowance (bytes)."""
    memory = analyse(graph).memory
    return max(p.bytes(batch) for p in memory.phases if p.phase == phase) - FRAMEWORK_ALLOWANCE_BYTES


# --- the step, by hand --------------------------------------------------------------------------


def test_mlp_step_by_hand() -> None:
    graph = trace_model(_mlp(), torch.randn(8, 784))
    training = graph["measured"]["training"]
    assert training["batchSizes"] == [8, 16] and training["tokens"] is None
    # parameters: 784*256 + 256 + 256*10 + 10 = 203,530 float32 = 814,120 B
    p = 814_120
    saved = {c["name"]: c["measured"].get("savedBytes") for c in graph["components"]}
    # fc1 saves the bf16 copy of its input, 8*784*2; ReLU its output, 8*256*2; dropout its bool
    # mask, 8*256; fc2 its input (the dropout output), 8*256*2
    assert saved == {"input": None, "0": 12_544, "1": 4_096, "2": 2_048, "3": 4_096, "output": None}
    # forward peak, at fc2's output: parameters, moments (2p), the batch (x 8*784*4 = 25,088), the
    # bf16 weight copies (401,408 + 512 + 5,120 + 20), x's bf16 copy 12,544, ReLU out 4,096, the
    # dropout's output 4,096 and mask 2,048, fc2's output 8*10*2 = 160 (fc1's output is freed)
    assert _phase_peak(graph, "forward", 8) == 3 * p + 25_088 + 407_060 + 12_544 + 4_096 + 4_096 + 2_048 + 160
    # backward peak, at fc1's float32 weight gradient (802,816) while its bf16 gradient (401,408)
    # lives: parameters, moments, the batch and target (25,088 + 64), the logits (160), the loss
    # and its gradient (4 + 4), fc2's weight and bias and fc1's bias gradients (10,240 + 40 + 1,024)
    assert _phase_peak(graph, "backward", 8) == (3 * p + 25_088 + 64 + 160 + 8 + 10_240 + 40 + 1_024
                                                  + 401_408 + 802_816)
    # optimizer peak: parameters, gradients, moments, the sqrt temporaries (5p), the batch and
    # target, the logits and the loss
    assert _phase_peak(graph, "optimizer", 8) == 5 * p + 25_088 + 64 + 160 + 4
    assert training["peakPhase"] == "optimizer"
    assert training["stateBytes"] == {"masterWeights": p, "gradients": p, "optimizerMoments": 2 * p,
                                      "optimizerTemporaries": p, "other": 4}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_weights_train_as_float32_master_weights(dtype: torch.dtype) -> None:
    # a checkpoint whose config says torch_dtype bfloat16 is built in 16 bits; mixed-precision
    # training still keeps float32 master weights, gradients and moments: the state of the float32
    # model, 4 bytes per trainable parameter each (203,530 parameters: 814,120 B), not 2
    half = _mlp().to(dtype)
    graph = trace_model(half, torch.randn(8, 784, dtype=dtype))
    assert graph["measured"]["paramBytes"] == 203_530 * 2  # the graph keeps the stored dtype
    training = graph["measured"]["training"]
    p = 814_120
    assert training["stateBytes"] == {"masterWeights": p, "gradients": p, "optimizerMoments": 2 * p,
                                      "optimizerTemporaries": p, "other": 4}
    assert training["upcastParams"] == 203_530
    assert "upcastParams" not in trace_model(_mlp(), torch.randn(8, 784))["measured"]["training"]
    # a frozen 16-bit layer stays in 16 bits (LoRA's base weights): 256*10 + 10 elements, 2 bytes
    half[3].requires_grad_(False)
    training = trace_model(half, torch.randn(8, 784, dtype=dtype))["measured"]["training"]
    assert training["upcastParams"] == 784 * 256 + 256
    assert training["stateBytes"]["frozenWeights"] == (256 * 10 + 10) * 2
    assert training["stateBytes"]["masterWeights"] == (784 * 256 + 256) * 4


def test_autocast_dtypes_and_storages_as_cuda_keeps_them() -> None:
    """LayerNorm and softmax run in float32 under CUDA autocast; in-place ReLU shares its input's
    storage; max pooling keeps int64 indices; BatchNorm keeps float32 statistics."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Softmax(dim=-1))
    graph = trace_model(block, torch.randn(4, 16))
    saved = {c["name"]: c["measured"].get("savedBytes") for c in graph["components"]}
    # Linear: x as bf16, 4*16*2; LayerNorm: its bf16 input cast to float32, 4*16*4, and mean and
    # rstd, 2*4*4; softmax: its float32 output, 4*16*4
    assert (saved["0"], saved["1"], saved["2"]) == (128, 256 + 32, 256)

    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2))
    graph = trace_model(conv, torch.randn(2, 3, 8, 8))
    saved = {c["name"]: c["measured"].get("savedBytes") for c in graph["components"]}
    # conv: its input as bf16, 2*3*8*8*2; BatchNorm: the conv's bf16 output, 2*8*8*8*2, and float32
    # mean and invstd, 2*8*4; in-place ReLU: the same storage, saved once more as its output: 2,048;
    # max pooling: its input is the ReLU's (counted there), its int64 indices 2*8*4*4*8
    assert (saved["0"], saved["1"], saved["2"], saved["3"]) == (768, 2_048 + 64, 2_048, 2_048)


def test_autocast_lists_cover_every_op_cuda_autocast_handles() -> None:
    """Every operation that has an AutocastCUDA kernel in this PyTorch build has a policy here
    (by its Python name), except the ones no Python call reaches."""
    covered = LOWER_PRECISION | FP32 | FP32_SET_OPT_DTYPE | PROMOTE
    cuda = {name[len("aten::"):].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA")}
    unreachable = {"binary_cross_entropy", "cudnn_convolution", "cudnn_convolution_transpose"}  # banned; cuDNN
    assert cuda, "this build registers no AutocastCUDA kernels"
    assert sorted(cuda - covered - unreachable) == []


# --- the user's model is left alone -------------------------------------------------------------


def test_the_model_is_untouched() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5),
                          nn.Linear(4 * 6 * 6, 3))
    model.eval()
    model[4].train()  # a mixed set of flags must come back as it was
    before = copy.deepcopy(model.state_dict())
    flags = [m.training for m in model.modules()]
    x = torch.randn(2, 3, 8, 8)
    rng = torch.get_rng_state()
    graph = trace_model(model, x)
    assert "error" not in graph["measured"]["training"]
    assert [m.training for m in model.modules()] == flags
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm stats too
    assert all(p.grad is None and p.device.type == "cpu" for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)
    assert not torch.is_autocast_enabled("cuda")


def test_a_step_that_cannot_be_rehearsed_still_traces_and_says_why(tmp_path, capfd) -> None:
    (tmp_path / "model.py").write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class Select(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n"
        "        y = self.fc(x)\n"
        "        return y[y > 0].sum()  # a shape that depends on the values: no meta tensor has one\n"
    )
    code, _, err = run_cli(["model.py:Select", "--input", "2,8", "-o", "gate.neurarch.json"], tmp_path, capfd)
    assert code == 0
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("wrote gate.neurarch.json")
    assert lines[0].startswith("neurarch-trace: note: memory will be estimated from layer outputs: the training "
                               "step could not be rehearsed on the meta device "
                               "(NotImplementedError: The register_meta function for torch.nonzero()")
    graph = json.loads((tmp_path / "gate.neurarch.json").read_text())
    plan = make_plan(graph)["plan"]
    assert plan["memory"]["source"] == "estimated"
    assert plan["memory"]["reason"].startswith("the training step was not rehearsed: ")


def test_a_branch_on_a_value_replays_the_traced_value() -> None:
    """Meta tensors have no values: a forward that reads one (``if y.sum() > 0``, transformers'
    check for packed sequences) gets the value the traced forward read at the same place."""

    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y * 2 if y.sum() > 0 else y

    torch.manual_seed(0)
    training = trace_model(Gate(), torch.randn(2, 8))["measured"]["training"]
    assert "error" not in training and training["batchSizes"] == [2, 4]
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=500, use_cache=False)
    graph = trace_model(transformers.GPT2Model(cfg), torch.randint(0, 500, (1, 32)))
    assert "error" not in graph["measured"]["training"]


# --- the plan uses the measurement ---------------------------------------------------------------


def test_the_card_says_measured() -> None:
    resnet = load_example("resnet")
    graph = trace_model(resnet.ResNet18(), torch.randn(1, 3, 224, 224))
    answer = make_plan(graph)
    plan = answer["plan"]
    assert plan["memory"]["source"] == "measured" and plan["memory"]["reason"] is None
    phase = plan["memory"]["peakPhase"]
    assert f"|                 measured: rehearsed step, peak in the {phase}".ljust(67) + "|" in answer["text"]
    memory = analyse(graph).memory
    batch = plan["fit"]["batch"]
    assert plan["cost"]["peakGb"] == pytest.approx(memory.peak_bytes(batch) / 1e9)
    assert plan["cost"]["activationGb"] == pytest.approx(batch * memory.peak(batch).per_sample_bytes / 1e9)
    assert f"at batch {batch}" in plan["cost"]["assumptions"]
    # the state AdamW needs, exactly: 11,689,512 parameters x 4 bytes each for the master weights
    # and the gradients, x 8 for the moments
    state = graph["measured"]["training"]["peaks"]
    optimizer = max((e for e in state if e["phase"] == "optimizer"), key=lambda e: sum(e["stateBytes"].values()))
    n = 11_689_512
    assert optimizer["stateBytes"]["masterWeights"] == 4 * n
    assert optimizer["stateBytes"]["gradients"] == 4 * n
    assert optimizer["stateBytes"]["optimizerMoments"] == 8 * n
    assert optimizer["stateBytes"]["optimizerTemporaries"] == 4 * n


# --- consistency --------------------------------------------------------------------------------


def _card_numbers(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("| Warnings")]


@pytest.mark.parametrize("example, factory, shape", [
    pytest.param("resnet", "ResNet50", (1, 3, 224, 224), marks=pytest.mark.slow),  # seconds: the full run's
    ("vit", "ViT_Tiny", (1, 3, 32, 32)),
])
def test_depth_never_changes_the_card(example: str, factory: str, shape: tuple) -> None:
    model = getattr(load_example(example), factory)()
    x = torch.randn(*shape)
    cards = {depth: make_plan(trace_model(model, x, depth=depth))["text"] for depth in (None, 1, 2)}
    assert cards[1] == cards[None] and cards[2] == cards[None]


def test_depth_never_changes_a_number_of_a_transformers_card() -> None:
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=256)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 1000, (1, 64))
    cards = [_card_numbers(make_plan(trace_model(model, ids, depth=d))["text"]) for d in (None, 1, 3)]
    # the warnings read the graph's layers, which --depth hides; every number is the same
    assert cards[1] == cards[0] and cards[2] == cards[0]


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2)
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.proj(out)


class _SequenceFirst(nn.Module):
    """``(L, N, 16)`` in, ``(N, 5)`` out: a sequence-first LSTM fed the model's input inside a
    block of the user's, which ``--depth 0`` and ``--depth 1`` cut into one node."""

    def __init__(self) -> None:
        super().__init__()
        self.block = _Encoder()
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x)[-1])


def test_depth_never_changes_the_batch_of_a_sequence_first_model() -> None:
    """The batch axis of a sequence-first model is told by its nn.LSTM (axis 1 of ``(7, 3, 16)``);
    a depth that cuts the LSTM into a bigger node reads it from the full-depth trace, and counts
    the LSTM by its own formula inside that node: the batch size, the input's batchless shape, the
    rehearsed batch sizes, the FLOPs and the card are those of the full depth."""
    torch.manual_seed(0)
    model = _SequenceFirst()
    x = torch.randn(7, 3, 16)
    graphs = {depth: trace_model(model, x, depth=depth) for depth in (None, 0, 1)}
    for depth, graph in graphs.items():
        assert graph["measured"]["batchSize"] == 3, depth
        assert graph["components"][0]["outputShape"] == [7, 16], depth
        assert graph["measured"]["training"]["batchSizes"] == [3, 6], depth
        assert graph["components"][-1]["measured"]["outputShapes"] == [[5]], depth
    assert [c["name"] for c in graphs[0]["components"]] == ["x", "_SequenceFirst", "output"]
    assert graphs[0]["components"][1]["inputShape"] == [7, 16]
    # the LSTM inside a node is counted by its node formula, as at full depth (its CPU kernel,
    # aten.mkldnn_rnn_layer, has no FLOP formula): 2 layers x 7 steps x 3 sequences x
    # 2 * 4 gates * 32 * (16 + 32) and 2 * 4 * 32 * (32 + 32), plus the two linears
    lstm = 7 * 3 * (2 * 4 * 32 * (16 + 32) + 2 * 4 * 32 * (32 + 32))
    flops = lstm + 2 * 7 * 3 * 32 * 32 + 2 * 3 * 32 * 5
    for depth, graph in graphs.items():
        assert graph["measured"]["flops"] == flops and graph["measured"]["uncountedOps"] == [], depth
        assert graph["measured"]["flopsByKind"] == {"matmul": flops}, depth
    assert graphs[0]["components"][1]["measured"]["flops"] == flops
    cards = {depth: _card_numbers(make_plan(graph)["text"]) for depth, graph in graphs.items()}
    assert cards[0] == cards[None] and cards[1] == cards[None]


def _small(name: str) -> tuple[nn.Module, int]:
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=1024)
        return transformers.GPT2LMHeadModel(cfg), 500
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, vocab_size=500)
        return transformers.BertModel(cfg), 500
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=500, max_position_embeddings=1024)
    return transformers.LlamaForCausalLM(cfg), 500


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_seq_len_plans_as_a_trace_at_that_length(name: str) -> None:
    model, vocab = _small(name)
    short = trace_model(model, torch.randint(0, vocab, (1, 64)))
    long = trace_model(model, torch.randint(0, vocab, (1, 512)))
    for attention in ("sdpa", "eager"):
        sized = analyse(short, seq_len=512, attention=attention)
        traced = analyse(long, attention=attention)
        assert sized.flops_per_sample == pytest.approx(traced.flops_per_sample, rel=0.03)
        for batch in (1, 8, 64, 512):
            assert sized.memory.peak_bytes(batch) == pytest.approx(traced.memory.peak_bytes(batch), rel=0.03)
            for phase in ("forward", "backward", "optimizer"):  # every phase's line, not only the peak's
                lines = [max(p.bytes(batch) for p in m.phases if p.phase == phase) for m in (sized.memory,
                                                                                              traced.memory)]
                assert lines[0] == pytest.approx(lines[1], rel=0.03)
    # the attention-score FLOPs are quadratic: linear scaling would be short by their share
    assert short["measured"]["training"]["flopsSeqSquaredFraction"] > 0


def test_eager_attention_adds_the_score_matrices_of_functional_attention() -> None:
    """transformers' BERT computes attention inside its layers with F.scaled_dot_product_attention:
    eager attention keeps, per layer, the float32 softmax (4 B a score), its bf16 dropout output
    (2 B) and bool mask (1 B) where the fused kernel keeps its bf16 output (2 B a value) and a
    float32 log-sum-exp per row (4 B)."""
    model, vocab = _small("bert")
    length, heads, head_dim, layers = 128, 4, 16, 2
    graph = trace_model(model, torch.randint(0, vocab, (1, length)))
    attention = graph["measured"]["training"]["attention"]
    assert attention["sdpaCalls"] == layers and attention["kernels"] == {"flash": layers}
    scores, kept = 7 * heads * length * length, 2 * heads * length * head_dim + 4 * heads * length
    assert attention["eagerScoreBytesPerSample"] == layers * scores
    assert attention["fusedKeptBytesPerSample"] == layers * kept
    per_layer = scores - kept
    assert attention["eagerExtraBytesPerSample"] == layers * per_layer
    # one call's backward, at the softmax's: its float32 output, the float32 gradient coming in and
    # the one going out are alive together, 12 B a score where the forward saved 7 (the dropout
    # output and mask already freed, their gradients too): 5 B a score, once (calls run one at a time)
    backward = 5 * heads * length * length
    assert attention["eagerBackwardBytesPerSample"] == backward
    sdpa, eager = analyse(graph, attention="sdpa").memory, analyse(graph, attention="eager").memory
    # added to every phase that holds the activations (the optimizer step holds none of them), and
    # the backward meets one call's backward on top
    for phase_sdpa, phase_eager in zip(sdpa.phases, eager.phases):
        added = phase_eager.per_sample_bytes - phase_sdpa.per_sample_bytes
        expected = {"forward": layers * per_layer, "loss": layers * per_layer,
                    "backward": layers * per_layer + backward}.get(phase_sdpa.phase, 0)
        assert added == expected
    assert make_plan(graph, attention="eager")["plan"]["cost"]["breakdown"]["attentionScoresGb"] > 0


@pytest.mark.slow  # seconds: the full run's
def test_a_model_stored_in_16_bits_plans_as_the_same_model_in_float32() -> None:
    """The rehearsed step holds a 16-bit model's trainable weights as float32 masters, so its
    residual stream is float32: what checkpointing keeps of each block (its output) is counted so
    too, and every line of the plan equals the float32 model's."""
    model, vocab = _small("llama")
    ids = torch.randint(0, vocab, (1, 128))
    graphs = {dtype: trace_model(copy.deepcopy(model).to(dtype), ids) for dtype in (torch.float32, torch.bfloat16)}
    assert graphs[torch.bfloat16]["measured"]["paramBytes"] * 2 == graphs[torch.float32]["measured"]["paramBytes"]
    steps = {}
    for dtype, graph in graphs.items():
        a = analyse(graph, seq_len=512, attention="eager")
        blocks = find_blocks(a.structure, a.structure_counts)
        assert blocks.layers == 2 and blocks.checkpoint_saving > 0
        step = tuning(a, blocks)
        steps[dtype] = (blocks.boundary_bytes, step.acts, [other[1] for other in step.others])
    assert steps[torch.bfloat16] == steps[torch.float32]


@pytest.mark.parametrize("layers", [2, 3])
def test_checkpointing_keeps_the_score_matrices_of_the_recomputed_block_alone(layers: int) -> None:
    """With activation checkpointing a block keeps only its output: the forward holds no block's
    insides and no score matrices; in the backward, the block being recomputed holds its own score
    matrices, one attention call's of the ``layers`` calls, and no more."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                  num_attention_heads=4, vocab_size=500)
    graph = trace_model(transformers.BertModel(cfg), torch.randint(0, 500, (1, 128)))
    # the formula for a step whose checkpointing was not rehearsed (a graph traced before it was,
    # a model transformers does not checkpoint): tests/test_checkpointing.py has the rehearsed one
    del graph["measured"]["training"]["checkpointed"]
    extra = graph["measured"]["training"]["attention"]["eagerExtraBytesPerSample"]
    assert extra == layers * (7 * 4 * 128 * 128 - (2 * 4 * 128 * 16 + 4 * 4 * 128))  # as worked above
    backward = {}
    for attention in ("sdpa", "eager"):
        a = analyse(graph, attention=attention)
        blocks = find_blocks(a.structure, a.structure_counts)
        assert blocks.layers == layers and blocks.checkpoint_saving > 0
        step = tuning(a, blocks)
        main = a.memory.peak(1)  # the step's own phase; the others in the memory model's order
        phases = [main] + [p for p in a.memory.phases if p is not main]
        acts = [step.acts] + [other[1] for other in step.others]
        forward = [act for phase, act in zip(phases, acts) if phase.phase == "forward"]
        assert len(forward) == 1 and forward[0].checkpointed > 0  # not clamped at 0
        freed = forward[0].plain - forward[0].checkpointed
        # every block's insides but its output, and every call's score matrices
        scores = extra if attention == "eager" else 0
        assert freed == pytest.approx(blocks.block_bytes - blocks.boundary_bytes + scores)
        backward[attention] = max(act.checkpointed for phase, act in zip(phases, acts) if phase.phase == "backward")
        assert backward[attention] < max(act.plain for act in acts)
    # the recomputed block's score matrices at most, one call's, and what that call's backward
    # allocates on top of them (5 B a score, see the test above)
    one_backward = graph["measured"]["training"]["attention"]["eagerBackwardBytesPerSample"]
    assert one_backward == 5 * 4 * 128 * 128
    assert 0 < backward["eager"] - backward["sdpa"] <= extra / layers + one_backward + 1e-6


def test_eager_attention_asked_of_a_model_without_sdpa_calls_says_so() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True)

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x)[0]  # need_weights=True: the score matrix is computed and kept

    graph = trace_model(SelfAttention(), torch.randn(2, 10, 32))
    assert graph["measured"]["training"]["attention"]["sdpaCalls"] == 0
    plan = make_plan(graph, attention="eager")["plan"]
    assert plan["memory"]["source"] == "measured"
    assert any("calls no scaled_dot_product_attention" in note for note in plan["notes"])


# --- models of any size, on meta ------------------------------------------------------------------


@pytest.mark.slow  # seconds: the full run's
def test_llama_7b_config_rehearses_on_meta() -> None:
    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    out = rehearse_training_step(model, (torch.randint(0, 1000, (1, 128), device="meta"),), batch_size=1)
    training = out["measured"]
    n = 6_738_415_616  # LLaMA-7B's parameters
    assert training["peakPhase"] == "optimizer"
    assert training["stateBytes"]["masterWeights"] == 4 * n and training["stateBytes"]["optimizerMoments"] == 8 * n
    assert training["attention"]["kernels"] == {"flash": 32}
    # the cached bf16 copies of the weights that matrix products use are alive in the forward, 2
    # bytes a parameter: not the embedding (32000*4096, a lookup, not on autocast's lists) nor the
    # 65 RMSNorm weights of 4096 (multiplied in float32)
    forward = max((e for e in training["peaks"] if e["phase"] == "forward"), key=lambda e: e["stateBytes"]["weights16"])
    assert forward["stateBytes"]["weights16"] == 2 * (n - 32000 * 4096 - 65 * 4096)
    assert out["savedBytes"]["model.layers.0"][0] > 0


def test_a_rehearsal_of_an_example_runs_from_the_command_line(tmp_path, capfd) -> None:
    code, _, err = run_cli([str(ROOT / "examples/models/gpt.py") + ":TinyGPT", "--input", "2,64:long",
                            "-o", "gpt.neurarch.json"], tmp_path, capfd)
    assert code == 0 and "not rehearsed" not in err
    graph = json.loads((tmp_path / "gpt.neurarch.json").read_text())
    training = graph["measured"]["training"]
    assert training["tokens"] == [64, 32] and training["batchSizes"] == [2, 4]
    assert all(isinstance(c["measured"].get("savedBytes"), int) for c in graph["components"]
               if c["type"] in ("linear", "layerNorm", "embedding"))


class ReadsValues(nn.Module):
    """Reads tensor values into Python between its layers: ``bool(t)`` and ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.mean() > -1e9:
            h = h * 2
        h = h * float(h.abs().max().item() > 0)
        return self.b(h)


def test_values_the_forward_reads_are_replayed_in_the_rehearsal():
    # the meta device has no values: the rehearsal replays those the traced forward read, in order,
    # so every such read must reach the FLOP mode (none is a "zero-FLOP" shortcut around it)
    torch.manual_seed(0)
    graph = trace_model(ReadsValues(), torch.randn(4, 8))
    training = graph["measured"]["training"]
    assert "error" not in training, training
    assert training["batchSizes"] == [4, 8]


@pytest.mark.slow  # seconds: the full run's
def test_llama_7b_in_bfloat16_plans_as_mixed_precision_and_needs_the_fewest_cards() -> None:
    """A LLaMA-7B built in bfloat16 (its config.json's torch_dtype) trains with float32 master
    weights, gradients and moments; and a cluster too small is told the fewest cards that hold a
    step (in whole nodes past 8), a count the plan then accepts (one node fewer it refuses)."""
    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    graph = trace_model(model, torch.randint(0, 1000, (1, 128), device="meta"))
    n = 6_738_415_616
    assert graph["measured"]["paramBytes"] == 2 * n
    training = graph["measured"]["training"]
    assert training["upcastParams"] == n
    assert training["stateBytes"]["masterWeights"] == 4 * n and training["stateBytes"]["optimizerMoments"] == 8 * n
    # on one GPU the backward peaks at batch 1 (4,096 eager tokens); two H100s hold it with ZeRO-2
    # (ZeRO-1 keeps every gradient on each GPU: over 80 GB with the headroom, once the KV cache's
    # value tensors, which the attention saves too, are no longer taken out twice with
    # checkpointing), and the card names the backward
    assert analyse(graph, seq_len=4096, attention="eager").memory.peak(1).phase == "backward"
    plan = make_plan(graph, seq_len=4096, attention="eager")["plan"]
    assert (plan["fit"]["gpu"], plan["fit"]["gpus"], plan["fit"]["strategy"]) == ("H100", 2, "zero2+ckpt")
    assert plan["memory"]["peakPhase"] == "backward"
    for card in ("RTX-4090", "T4"):
        needs = make_plan(graph, seq_len=2048, gpu=f"{card}x2")["plan"]["fit"]["needs"]
        count = needs["gpus"]
        assert make_plan(graph, seq_len=2048, gpu=f"{card}x{count}")["plan"]["fit"]["fits"] is True
        # counted as the planner counts clusters, 1 to 8 then whole 8-GPU nodes: one node fewer
        # does not hold it
        fewer = count - 1 if count <= 8 else count - 8
        assert count <= 8 or count % 8 == 0
        assert make_plan(graph, seq_len=2048, gpu=f"{card}x{fewer}")["plan"]["fit"]["fits"] is False


def test_a_16_bit_base_and_the_kv_cache_are_measured() -> None:
    """The step is also rehearsed with the weights in 16 bits (a LoRA base): its activations are
    smaller than full training's float32-master ones, by less than half (the loss and softmax run
    in float32 either way). The KV cache transformers returns with ``use_cache`` is measured: a
    float32 key (rotary in float32) and a 16-bit value per layer, per token, per key/value head."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=500)
    torch.manual_seed(0)
    graph = trace_model(transformers.LlamaForCausalLM(cfg), torch.randint(0, 500, (1, 32)))
    training = graph["measured"]["training"]
    head_dim = 64 // 4
    assert training["kvCacheBytesPerSample"] == 2 * 32 * 2 * head_dim * (4 + 2)  # layers x tokens x kv heads
    # the 16-bit values are what flash attention saves as they are (the float32 keys it gets cast)
    assert training["kvCacheSavedBytesPerSample"] == 2 * 32 * 2 * head_dim * 2
    top = max(training["peaks"], key=lambda p: sum(p["perSampleBytes"].values()))
    full = top["perSampleBytes"]["activations"]
    assert full / 2 < training["halfWeightsActivationBytesPerSample"] < full
    a = analyse(graph)
    assert a.memory.half_weights_ratio == training["halfWeightsActivationBytesPerSample"] / full
    cfg.use_cache = False  # on the CPU the forward runs without a cache, and none is measured
    no_cache = trace_model(transformers.LlamaForCausalLM(cfg), torch.randint(0, 500, (1, 32)))["measured"]["training"]
    assert "kvCacheBytesPerSample" not in no_cache
    # a model with one linear layer (its output layer) has no base to adapt: no 16-bit step
    assert "halfWeightsActivationBytesPerSample" not in trace_model(
        nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 30 * 30, 10)),
        torch.randn(2, 3, 32, 32))["measured"]["training"]


def test_a_diff_says_when_one_peak_is_measured_and_the_other_estimated() -> None:
    # the same network with and without its rehearsed step: the diff's peaks differ by the method
    # alone (a new-user pass: +2.3 GB between two identical ResNet-18s), and the card says so
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    measured = trace_model(model, torch.randn(4, 64))
    estimated = copy.deepcopy(measured)
    estimated["measured"].pop("training")
    plan = make_plan(measured, base=estimated)
    assert plan["plan"]["diff"]["sources"] == {"new": "measured", "base": "estimated"}
    assert plan["plan"]["diff"]["params"]["delta"] == 0
    text = " ".join(line.strip("|").strip() for line in plan["text"].splitlines())
    assert "peaks: the new one measured, the base's estimated" in text
    assert "peaks:" not in make_plan(measured, base=measured)["text"]


def test_grouped_query_attention_keeps_its_key_and_value_heads_unrepeated_in_flash() -> None:
    # CUDA's FlashAttention-2 takes 2 key/value heads for 8 query heads as they are: the tensors
    # saved for backward are the key and value themselves, not 4x repeated copies (Mistral-7B and
    # Qwen2 LoRA steps read 1.03x to 1.05x an H200's peak with the copies); the memory-efficient
    # kernel, which a mask sends the call to, takes them repeated
    from neurarch_trace.rehearsal.attention import FusedAttention

    def saved_by(attention: FusedAttention, **kwargs) -> tuple[list, torch.Tensor, torch.Tensor]:
        q = torch.empty(2, 8, 64, 16, dtype=torch.bfloat16, device="meta", requires_grad=True)
        k, v = (torch.empty(2, 2, 64, 16, dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in "kv")
        saved: list = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = attention(q, k, v, **kwargs)
        out.float().sum().backward()
        assert (k.grad.shape, v.grad.shape) == (k.shape, v.shape)
        return saved, k, v

    flash = FusedAttention()
    saved, k, v = saved_by(flash, is_causal=True, enable_gqa=True)
    assert flash.kernels() == {"flash": 1}
    storages = {id(t.untyped_storage()) for t in saved}
    assert id(k.untyped_storage()) in storages and id(v.untyped_storage()) in storages
    assert [tuple(t.shape) for t in saved if t.dim() == 4 and t.shape[1] == 8 and t.shape[-1] == 16] == \
        [(2, 8, 64, 16), (2, 8, 64, 16)]  # the query and the output only
    masked = FusedAttention()
    saved, k, v = saved_by(masked, attn_mask=torch.ones(64, 64, dtype=torch.bool, device="meta"), enable_gqa=True)
    assert masked.kernels() == {"efficient": 1}
    assert len([t for t in saved if t.dim() == 4 and t.shape[1] == 8 and t.shape[-1] == 16]) == 4  # q, k, v, out


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_trace_under_no_grad_or_inference_mode_still_rehearses_the_step(mode) -> None:
    # a new-user pass: a notebook cell under torch.no_grad() lost the step, told "no output of the
    # model depends on a trainable parameter"
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    expected = trace_model(model, torch.randn(2, 4))["measured"]["training"]
    with mode():
        training = trace_model(model, torch.randn(2, 4))["measured"]["training"]
    assert "error" not in training
    assert training["peaks"] == expected["peaks"]
    assert torch.is_grad_enabled()  # the caller's mode is back after the block
