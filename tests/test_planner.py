"""The planner, without HTTP: exact numbers for small graphs, worked out by hand next to each.

Conventions the working uses (see the planner's module docstrings): FLOPs per sample, one
multiply-add = 2 FLOPs, only matmuls/convs counted; training memory = 18 bytes per trainable
parameter + activations (inputs at 4 bytes, layer outputs at 2) x batch + 1e9 bytes framework
allowance; a card fits when peak x 1.15 <= its memory (GB = 1e9 bytes); cost = 3 x FLOPs x
samples / (peak TFLOPS x 1e12 x 0.40) / 3600 x $/h.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from neurarch_trace.errors import GraphError
from neurarch_trace.planner import make_plan, target_label
from neurarch_trace.planner.card import WIDTH
from neurarch_trace.planner.gpus import gpu_table

DATA = Path(__file__).parent / "data"


def load(name: str) -> Dict[str, Any]:
    return json.loads((DATA / f"{name}.neurarch.json").read_text())


def node(id_: str, type_: str, params: Optional[dict] = None, inp: Optional[list] = None,
         out: Optional[list] = None, **extra: Any) -> Dict[str, Any]:
    comp: Dict[str, Any] = {"id": id_, "name": id_, "type": type_, "params": params or {}}
    if inp is not None:
        comp["inputShape"] = inp
    if out is not None:
        comp["outputShape"] = out
    comp.update(extra)
    return comp


def graph(name: str, comps: List[dict], edges: Optional[List[tuple]] = None, **extra: Any) -> Dict[str, Any]:
    """A graph; without ``edges`` the components are chained in order."""
    if edges is None:
        edges = [(a["id"], b["id"]) for a, b in zip(comps, comps[1:])]
    conns = [{"id": f"e{i}", "from": a, "to": b, "fromPort": "bottom", "toPort": "top"}
             for i, (a, b) in enumerate(edges)]
    return {"id": name, "name": name, "description": "", "components": comps, "connections": conns, **extra}


def row(label: str, value: str) -> str:
    """One card line: a 16-column label and the value, padded to the 68-column box."""
    return "| " + (label.ljust(16) + value).ljust(64) + " |"


def plan_of(doc: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
    return make_plan(doc, **kwargs)["plan"]


T4_USD_PER_S = 0.59 / 3600
T4_EFFECTIVE_FLOPS = 65e12 * 0.40  # 2.6e13 FLOP/s
T4_CONV_EFFECTIVE_FLOPS = 65e12 * 0.20  # convolution-dominated models: 1.3e13 FLOP/s


# --- parameters, FLOPs, memory, fit and cost of hand-made graphs --------------------------------


def test_mlp_numbers_by_hand() -> None:
    plan = plan_of(load("mlp"))
    model = plan["model"]
    # fc1: 784*256 + 256 = 200,960; fc2: 256*10 + 10 = 2,570
    assert model["params"] == 200_960 + 2_570 == 203_530
    # fc1: 2*784*256 = 401,408; fc2: 2*256*10 = 5,120
    assert model["flops"] == 401_408 + 5_120 == 406_528
    assert model["layers"] == 4
    assert (model["paramsSource"], model["flopsSource"], model["flopsComplete"]) == ("estimated", "estimated", True)
    assert model["input"] == {"kind": "other", "shape": [784], "describe": "784", "tracedTokens": None}

    cost = plan["cost"]
    # static: 203,530 params * 18 B = 3,663,540 B, + 1e9 framework allowance
    assert cost["staticGb"] == pytest.approx((3_663_540 + 1_000_000_000) / 1e9, rel=1e-12)
    # per sample: input 784*4 = 3,136; fc1, act, drop 256*2 = 512 each; fc2 10*2 = 20 -> 4,692 B;
    # the loss in float32 on the 10 outputs: 10*8 = 80 -> 4,772 B
    assert cost["perSampleGb"] == pytest.approx(4_772 / 1e9, rel=1e-12)
    assert cost["breakdown"]["lossGb"] == pytest.approx(1024 * 80 / 1e9, rel=1e-12)
    # need at the 1024 cap: (1,003,663,540 + 1024*4,772) * 1.15 = 1.16e9 <= 16e9: the cheapest card
    assert plan["fit"]["gpu"] == "T4" and plan["fit"]["batch"] == 1024 and cost["batch"] == 1024
    assert cost["peakGb"] == pytest.approx((1_003_663_540 + 1024 * 4_772) / 1e9, rel=1e-12) == pytest.approx(
        1.008550068)
    assert cost["activationGb"] == pytest.approx(1024 * 4_772 / 1e9, rel=1e-12)
    assert plan["fit"]["needGb"] == pytest.approx(1.008550068 * 1.15, rel=1e-12)
    assert "at batch 1024" in cost["assumptions"]
    assert cost["seqLen"] is None

    training = cost["training"]
    assert training["unit"] == "million-samples" and training["samples"] == 1e6
    # 3 * 406,528 * 1e6 = 1.219584e12 FLOPs; / 2.6e13 FLOP/s = 0.0469 s on a T4
    assert training["flops"] == pytest.approx(1.219584e12, rel=1e-12)
    assert training["seconds"] == pytest.approx(1.219584e12 / T4_EFFECTIVE_FLOPS, rel=1e-12)
    assert training["usd"] == pytest.approx(1.219584e12 / T4_EFFECTIVE_FLOPS * T4_USD_PER_S, rel=1e-12)
    assert plan["run"] == {"legal": True, "blockers": [], "details": []}
    assert plan["warnings"] == []


def test_mlp_card_exactly() -> None:
    text = make_plan(load("mlp"), source={"kind": "trace", "target": "models/mlp.py:MLP"})["text"]
    assert text == "\n".join([
        "+------------------------------------------------------------------+",
        "| MLP                                               models/mlp.py  |",
        "| 4 layers, 203.5K params, 406.5 KFLOPs at 784                     |",
        "| (estimated from layer params and shapes: no measured totals)     |",
        "+------------------------------------------------------------------+",
        "| Runs            yes, shapes propagate end to end                 |",
        "| GPU fit         T4 16 GB at batch 1,024 fp16 (1.0 GB peak)       |",
        "|                 estimated from layer outputs (no measured step)  |",
        "| Training cost   <$0.01 per million samples on a T4               |",
        "|                 <1 s at 40% of 65 TFLOPS fp16 (eager dispatch    |",
        "|                 not counted), $0.59/h                            |",
        "| Blockers        none                                             |",
        "| Warnings        none                                             |",
        "+------------------------------------------------------------------+",
    ])


def test_tiny_cnn_numbers_by_hand() -> None:
    plan = plan_of(load("tiny_cnn"))
    # conv 16*3*3*3 = 432 (no bias); bn 2*16 = 32; fc 16*10 + 10 = 170
    assert plan["model"]["params"] == 432 + 32 + 170 == 634
    # conv: 2 * (16*32*32 output elements) * 3 input channels * 9 = 884,736; fc 2*16*10 = 320
    assert plan["model"]["flops"] == 2 * 16_384 * 3 * 9 + 320 == 885_056
    assert plan["model"]["input"]["kind"] == "image"
    # static: 634*18 = 11,412 + BatchNorm buffers 2*4*16 + 8 = 136 + 1e9
    # per sample: input 3,072*4 = 12,288; conv, bn, relu 16,384*2 = 32,768 each; pool, flat 16*2 = 32
    # each; fc 10*2 = 20 -> 110,676 B; loss 10*8 = 80 -> 110,756 B;
    # at batch 1024: 1,000,011,548 + 113,414,144 = 1,113,425,692
    assert plan["cost"]["breakdown"]["buffersGb"] == pytest.approx(136 / 1e9, rel=1e-12)
    assert plan["cost"]["perSampleGb"] == pytest.approx(110_756 / 1e9, rel=1e-12)
    assert plan["cost"]["peakGb"] == pytest.approx(1_113_425_692 / 1e9, rel=1e-12)
    # 32 px < 64: an epoch of CIFAR-10, 3 * 885,056 * 50,000 = 1.327584e11 FLOPs
    training = plan["cost"]["training"]
    assert (training["unit"], training["per"], training["samples"]) == (
        "cifar-10-epoch", "per epoch of CIFAR-10", 50_000)
    assert training["flops"] == pytest.approx(1.327584e11, rel=1e-12)
    # the conv carries 884,736 of 885,056 layer FLOPs: the convolutional utilisation, 20%
    assert training["mfu"] == 0.20
    assert training["seconds"] == pytest.approx(1.327584e11 / T4_CONV_EFFECTIVE_FLOPS, rel=1e-12)
    # a ResNet-style head without dropout is the canonical design: no warning (issue 16.6)
    assert plan["warnings"] == []


def _wide_conv(channels: int) -> Dict[str, Any]:
    """1x1000x1000 input, one 3x3 conv to ``channels`` maps: activation-bound."""
    return graph("Wide", [
        node("x", "input", {"shape": [1, 1000, 1000]}, out=[1, 1000, 1000]),
        node("conv", "conv2d", {"inChannels": 1, "outChannels": channels, "kernelSize": 3, "padding": 1, "bias": False},
             [1, 1000, 1000], [channels, 1000, 1000]),
        node("y", "output", inp=[channels, 1000, 1000]),
    ])


def test_gpu_fit_largest_power_of_two_batch() -> None:
    plan = plan_of(_wide_conv(64))
    # static: 64*9 = 576 params * 18 = 10,368 + 1e9 = 1,000,010,368
    # per sample: input 1e6 * 4 = 4e6; conv 64e6 * 2 = 128e6; the loss on the 64e6-element output
    # in float32, 64e6 * 8 = 512e6 -> 644e6 B
    # T4: batch 16 -> (1,000,010,368 + 16*644e6) * 1.15 = 13.0e9 <= 16e9 (and < 0.85 * 16e9);
    # batch 32 -> 24.9e9 > 16e9
    fit = plan["fit"]
    assert (fit["gpu"], fit["batch"], fit["precision"], fit["borderline"]) == ("T4", 16, "fp16", False)
    assert fit["peakGb"] == pytest.approx(11_304_010_368 / 1e9, rel=1e-12)
    assert plan["cost"]["activationGb"] == pytest.approx(16 * 644e6 / 1e9, rel=1e-12)
    assert "at batch 16" in plan["cost"]["assumptions"]
    # 1000 px >= 64: ImageNet-1k; conv FLOPs 2 * 64e6 * 1 * 9 = 1.152e9
    assert plan["model"]["flops"] == 1_152_000_000
    assert plan["cost"]["training"]["samples"] == 1_281_167
    text = make_plan(_wide_conv(64))["text"]
    assert row("GPU fit", "T4 16 GB at batch 16 fp16 (11.3 GB peak)") in text.splitlines()


def test_gpu_fit_borderline() -> None:
    plan = plan_of(_wide_conv(150))
    # static 150*9*18 + 1e9 = 1,000,024,300; per sample 4e6 + 150e6*2 + 150e6*8 (loss) = 1,504e6
    # batch 8: peak 13,032,024,300; need x1.15 = 14,986,827,945 <= 16e9 but > 0.85*16e9 = 13.6e9
    fit = plan["fit"]
    assert (fit["gpu"], fit["batch"], fit["borderline"]) == ("T4", 8, True)
    assert fit["needGb"] == pytest.approx(14.986827945, rel=1e-12)
    lines = make_plan(_wide_conv(150))["text"].splitlines()
    assert row("", "borderline: needs 15.0 GB with x1.15 headroom") in lines


def _big_linear(fan_in: int, fan_out: int) -> Dict[str, Any]:
    return graph("Big", [
        node("x", "input", {"shape": [fan_in]}, out=[fan_in]),
        node("fc", "linear", {"inFeatures": fan_in, "outFeatures": fan_out, "bias": False}, [fan_in], [fan_out]),
        node("y", "output", inp=[fan_out]),
    ])


def test_gpu_fit_cheapest_card_that_holds_it() -> None:
    plan = plan_of(_big_linear(50_000, 30_000))
    # 1.5e9 params * 18 = 27e9 + 1e9 = 28e9 static; x1.15 = 32.2e9 > 24 GB (T4, L4, A10G), so the
    # next cheapest: L40S 48 GB ($1.95/h) before A100-40 ($2.10/h).
    # Per sample 50,000*4 + 30,000*2 + loss 30,000*8 = 500,000 B; L40S holds
    # (48e9/1.15 - 28e9)/500,000 = 27,478 samples, so the 1024 cap: peak 28e9 + 1024*500,000
    fit = plan["fit"]
    assert (fit["gpu"], fit["memoryGb"], fit["batch"], fit["precision"]) == ("L40S", 48, 1024, "bf16")
    assert fit["peakGb"] == pytest.approx(28.512, rel=1e-12)
    assert [c["batch"] for c in fit["cards"]][:3] == [0, 0, 0]
    card = make_plan(_big_linear(50_000, 30_000))["text"]
    assert row("GPU fit", "L40S 48 GB at batch 1,024 bf16 (28.5 GB peak)") in card.splitlines()
    # Training cost on the L40S: 3 * 2*50,000*30,000 = 9e9 FLOPs per sample * 1e6 samples
    training = plan["cost"]["training"]
    assert training["gpu"] == "L40S"
    assert training["seconds"] == pytest.approx(3 * 3e9 * 1e6 / (362.05e12 * 0.40), rel=1e-12)


def test_no_single_card_gives_a_cluster() -> None:
    doc = _big_linear(100_000, 100_000)
    plan = plan_of(doc)
    # 1e10 params * 18 = 180e9 + 1e9; per sample 100,000*4 + 100,000*2 + loss 100,000*8 = 1,400,000
    # one card at batch 1: peak 181,001,400,000; need x1.15 = 208,151,610,000 > 141e9 (H200)
    assert [c["batch"] for c in plan["fit"]["cards"]] == [0] * 8
    assert plan["fit"]["cards"][-1]["needGb"] == pytest.approx(208.15161, rel=1e-12)
    # A cluster, cheapest per unit: the H100 ($3.95/h over 989.4 TFLOPS is the lowest price per
    # FLOP), with the fewest GPUs. No blocks, so no checkpointing. ZeRO-3 would gather the one
    # 1e10-parameter layer (4 B each, 40 GB); ZeRO-2 per GPU: 16-bit weights 2e10 B + (16-bit
    # gradients 2 + fp32 master and AdamW 12) * 1e10 / N + 1e9: N = 3 -> 67.67e9 + batch * 1.4e6;
    # (69.57e9 - 67.67e9) / 1.4e6 = 1,359 samples, so the 1024 cap: 69.1e9 x 1.15 = 79.5e9 <= 80e9.
    # N = 2: 91e9 > 69.57e9; ZeRO-1 on 3 (2+2 + 12/3 B) = 81e9, too much.
    fit = plan["fit"]
    assert (fit["fits"], fit["gpu"], fit["gpus"], fit["strategy"], fit["batch"]) == (True, "H100", 3, "zero2", 1024)
    assert fit["peakGb"] == pytest.approx((2e10 + 14e10 / 3 + 1e9 + 1024 * 1.4e6) / 1e9, rel=1e-12)
    assert plan["cost"]["peakGb"] == fit["peakGb"] and plan["cost"]["batch"] == 1024
    assert "at batch 1024 per GPU on 3 GPUs" in plan["cost"]["assumptions"]
    # cost: 3 * 2e10 FLOPs * 1e6 samples = 6e16 / (989.4e12 * 0.40) = 151.6 GPU-s, x $3.95/h
    training = plan["cost"]["training"]
    assert (training["gpus"], training["flops"]) == (3, 6e16)
    assert training["gpuHours"] == pytest.approx(6e16 / (989.4e12 * 0.40) / 3600, rel=1e-12)
    assert training["seconds"] == pytest.approx(6e16 / (989.4e12 * 0.40) / 3, rel=1e-12)
    assert training["usd"] == pytest.approx(training["gpuHours"] * 3.95, rel=1e-12)
    lines = make_plan(doc)["text"].splitlines()
    assert row("GPU fit", "3x H100 80 GB at batch 1,024 per GPU bf16") in lines
    assert row("", "ZeRO-2, 69.1 GB peak per GPU") in lines
    assert row("Training cost", "~$0.17 per million samples on 3x H100") in lines


def test_nothing_fits_says_so() -> None:
    doc = _big_linear(1_000_000, 1_000_000)
    plan = plan_of(doc)
    # 1e12 params in one layer: 18e12 B on one card; ZeRO-3 gathers the whole layer (4e12 B), which
    # no number of GPUs divides
    assert plan["fit"]["fits"] is False and plan["fit"]["gpu"] is None
    assert plan["cost"]["batch"] == 1 and "at batch 1" in plan["cost"]["assumptions"]
    # per sample 1e6*4 + 1e6*2 + loss 1e6*8 = 14e6
    assert plan["cost"]["peakGb"] == pytest.approx((18e12 + 1e9 + 14e6) / 1e9, rel=1e-12)
    assert plan["cost"]["training"] is None
    assert plan["fit"]["needs"]["gpus"] is None and plan["fit"]["needs"]["gpu"] == "H200"
    lines = make_plan(doc)["text"].splitlines()
    assert row("GPU fit", "nothing fits: needs 20,701.2 GB at batch 1") in lines
    assert row("", "(peak x1.15; the largest card, H200, has 141 GB)") in lines
    assert row("", "no number of H200 holds one sample with ZeRO-3 +") in lines
    assert row("Training cost", "n/a: nothing holds a training step (see GPU fit)") in lines


def _token_model() -> Dict[str, Any]:
    return graph("TinyLM", [
        node("ids", "input", {"shape": [16]}, out=[16]),
        node("emb", "embedding", {"vocabSize": 1000, "embeddingDim": 64}, [16], [16, 64]),
        node("attn", "multiHeadAttention", {"hiddenDim": 64, "numHeads": 4}, [16, 64], [16, 64]),
        node("norm", "layerNorm", {"normalizedShape": 64}, [16, 64], [16, 64]),
        node("head", "linear", {"inFeatures": 64, "outFeatures": 1000}, [16, 64], [16, 1000]),
        node("logits", "output", inp=[16, 1000]),
    ])


def test_token_model_seq_len_and_eager_attention() -> None:
    plan = plan_of(_token_model(), seq_len=64, attention="eager")
    # embedding 1000*64 = 64,000; attention 4*64^2 + 4*64 = 16,640; norm 2*64 = 128;
    # head 64*1000 + 1000 = 65,000
    assert plan["model"]["params"] == 64_000 + 16_640 + 128 + 65_000 == 145_768
    # at the traced 16 tokens: attention 8*16*64^2 + 4*16^2*64 = 524,288 + 65,536 = 589,824;
    # head 2*16*64*1000 = 2,048,000 -> 2,637,824; seq_len 64 = 4 x traced: 10,551,296
    assert plan["model"]["flops"] == pytest.approx(4 * 2_637_824, rel=1e-12)
    assert plan["model"]["input"] == {"kind": "tokens", "shape": [16], "describe": "64 tokens", "tracedTokens": 16}
    assert plan["cost"]["seqLen"] == 64 and plan["cost"]["attention"] == "eager"
    # per sample at 16 tokens: ids 16*8 = 128; emb, attn, norm 16*64*2 = 2,048 each; head 16,000*2
    # = 32,000 -> 38,272 B, x4 = 153,088; eager scores 4 heads * 16*16 * 2 B = 2,048, x4^2 = 32,768
    assert plan["cost"]["breakdown"]["layerActivationsGb"] == pytest.approx(1024 * 153_088 / 1e9, rel=1e-12)
    assert plan["cost"]["breakdown"]["attentionScoresGb"] == pytest.approx(1024 * 32_768 / 1e9, rel=1e-12)
    # the loss on the [16, 1000] logits in float32: 16,000*8 = 128,000 B, x4 = 512,000
    assert plan["cost"]["breakdown"]["lossGb"] == pytest.approx(1024 * 512_000 / 1e9, rel=1e-12)
    # static 145,768*18 = 2,623,824 + 1e9; batch 1024 -> 1,002,623,824 + 1024*(185,856 + 512,000)
    assert plan["cost"]["peakGb"] == pytest.approx(1_717_228_368 / 1e9, rel=1e-12)
    # per billion tokens: 1e9/64 = 15,625,000 samples; 3 * 10,551,296 * 15,625,000 = 4.94592e14
    training = plan["cost"]["training"]
    assert (training["unit"], training["samples"]) == ("billion-tokens", 15_625_000)
    assert training["flops"] == pytest.approx(4.94592e14, rel=1e-12)
    assert "at 64 tokens" in make_plan(_token_model(), seq_len=64)["text"]
    # thousands separated, as the serving line's context is
    assert "at 2,048 tokens" in make_plan(_token_model(), seq_len=2048)["text"]


def test_eager_attention_in_functional_code_is_said_not_counted() -> None:
    plan = plan_of(load("traced_llama"), attention="eager")
    assert plan["cost"]["breakdown"]["attentionScoresGb"] == 0
    assert plan["notes"] == ["eager attention asked for, but no layer is typed as attention: score matrices "
                             "computed in functional code (as Hugging Face models do) are not counted"]


def test_token_model_sdpa_keeps_no_scores_and_traced_seq_len() -> None:
    plan = plan_of(_token_model())
    assert plan["cost"]["seqLen"] == 16
    assert plan["cost"]["breakdown"]["attentionScoresGb"] == 0
    assert plan["model"]["flops"] == 2_637_824


def test_seq_len_ignored_for_images() -> None:
    plan = plan_of(load("tiny_cnn"), seq_len=512)
    assert plan["cost"]["seqLen"] is None
    assert plan["model"]["flops"] == 885_056
    assert plan["notes"] == ["seq_len ignored: the model's input is not a sequence of token ids"]


def _measured_mlp() -> Dict[str, Any]:
    doc = load("mlp")
    by_id = {c["id"]: c for c in doc["components"]}
    by_id["fc1"]["measured"] = {"params": 200_960, "flops": 8 * 401_408, "outputDtype": "float32",
                                "outputBytes": 8 * 256 * 4, "outputShapes": [[256]]}
    by_id["fc2"]["measured"] = {"params": 2_570, "flops": 8 * 5_120, "outputDtype": "float32",
                                "outputBytes": 8 * 10 * 4, "outputShapes": [[10]]}
    doc["measured"] = {"tool": "neurarch-trace/0.1.0", "device": "cpu", "batchSize": 8,
                       "inputs": [{"name": "x", "shape": [8, 784], "dtype": "float32"}],
                       "params": 203_530, "trainableParams": 200_960, "frozenParams": 2_570,
                       "packedParams": 0, "buffers": 0, "bufferBytes": 0,
                       "flops": 8 * 406_528 + 8 * 1_000, "uncountedOps": [], "syntheticConnections": []}
    return doc


def test_measured_totals_win_over_estimates() -> None:
    plan = plan_of(_measured_mlp())
    # measured.flops at batch 8 includes 8,000 functional FLOPs the layers do not show: per sample
    # (3,252,224 + 8,000) / 8 = 407,528
    assert plan["model"]["flops"] == 407_528
    assert (plan["model"]["paramsSource"], plan["model"]["flopsSource"]) == ("measured", "measured")
    assert (plan["model"]["trainableParams"], plan["model"]["frozenParams"]) == (200_960, 2_570)
    # static: 200,960 trainable * 18 + 2,570 frozen * 2 + 1e9
    assert plan["cost"]["staticGb"] == pytest.approx((200_960 * 18 + 2_570 * 2 + 1e9) / 1e9, rel=1e-12)
    layers = {layer["name"]: layer for layer in plan["layers"]}
    assert layers["fc1"]["flops"] == 401_408 and layers["fc1"]["flopsSource"] == "measured"
    assert layers["act"]["flopsSource"] == "estimated"
    header = make_plan(_measured_mlp())["text"].splitlines()[:4]  # counts measured; memory not (no step)
    assert not any("estimated" in line for line in header)


def test_measured_null_flops_is_unknown_cost() -> None:
    doc = _measured_mlp()
    doc["components"][2]["type"] = "customModule"
    doc["components"][2]["params"] = {"className": "MyAct", "paramCount": 0}
    doc["components"][2]["measured"] = {"params": 0, "flops": None, "uncounted": ["aten.my_act"]}
    plan = plan_of(doc)
    assert plan["model"]["flopsComplete"] is False
    assert plan["warnings"] == ["a layer of unknown cost: 'act' (measured flops null (aten.my_act))"]
    assert "| 4 layers, 203.5K params, >=407.5 KFLOPs at 784" in make_plan(doc)["text"]


# --- the verifier ---------------------------------------------------------------------------------


def test_contract_blockers_name_the_layer() -> None:
    doc = graph("Broken", [
        node("in", "input", {"shape": [8]}, out=[8]),
        node("a", "linear", {"inFeatures": 8, "outFeatures": 8}, [8], [8]),
        node("b", "relu", {}, [8], [8]),
        node("c", "relu", {}, [8], [8]),
        node("lonely", "relu", {}, [8], [8]),
        node("dead", "relu", {}, [8], [8]),
        {**node("a", "relu", {}, [8], [8]), "name": "a2"},
        {**node("dup", "relu", {}, [8], [8]), "name": "b"},
    ], edges=[("in", "a"), ("a", "b"), ("b", "c"), ("c", "b"), ("a", "dead"), ("a", "ghost"), ("b", "dup")])
    plan = plan_of(doc)
    assert plan["run"]["legal"] is False
    assert plan["run"]["blockers"] == [
        "duplicate id 'a' (layers 'a' and 'a2')",
        "duplicate name 'b' (2 layers)",
        "connection e5 points to missing layer 'ghost' (from 'a')",
        "the graph has no output node",
        "'lonely' is connected to nothing (orphan)",
        "'dead' has no outgoing connection but is not an output (dead branch)",
        "'b' has no outgoing connection but is not an output (dead branch)",  # 'dup', named 'b'
        "cycle through 'b' -> 'c' -> 'b'",
    ]
    assert [d["code"] for d in plan["run"]["details"]] == [
        "duplicate-id", "duplicate-name", "dangling-connection", "no-output", "orphan",
        "sink-not-output", "sink-not-output", "cycle"]
    text = make_plan(doc)["text"]
    assert "| Runs            no, see Blockers (8)" in text
    # the fit and cost that follow size the graph as drawn, which does not run
    assert row("", "sized as drawn: runs once the Blockers are fixed") in text.splitlines()
    assert "Blockers are fixed" not in make_plan(load("mlp"))["text"]


def test_source_not_input_and_self_loop() -> None:
    doc = graph("Loops", [
        node("in", "input", {"shape": [4]}, out=[4]),
        node("stray", "relu", {}, [4], [4]),
        node("r", "relu", {}, [4], [4]),
        node("out", "output", inp=[4]),
    ], edges=[("in", "r"), ("r", "r"), ("r", "out"), ("stray", "out")])
    assert plan_of(doc)["run"]["blockers"] == [
        "'stray' has no incoming connection but is not an input",
        "cycle through 'r' -> 'r'",
    ]


def _one_layer(type_: str, params: dict, inp: list, out: list) -> Dict[str, Any]:
    return graph("One", [node("x", "input", {"shape": inp}, out=inp), node("L", type_, params, inp, out),
                         node("y", "output", inp=out)])


@pytest.mark.parametrize("type_, params, inp, out, blocker", [
    ("linear", {"inFeatures": 128, "outFeatures": 10}, [256], [10],
     "'L': inFeatures 128 does not match its input's last dim 256"),
    ("linear", {"inFeatures": 256, "outFeatures": 12}, [256], [10],
     "'L': outFeatures 12 does not match its output's last dim 10"),
    ("linear", {"inFeatures": 256, "outFeatures": -10}, [256], [10],
     "'L': outFeatures must be a positive integer, not -10"),
    ("conv2d", {"inChannels": 4, "outChannels": 8, "kernelSize": 3}, [3, 32, 32], [8, 30, 30],
     "'L': inChannels 4 does not match its input channels 3"),
    ("conv2d", {"inChannels": 3, "outChannels": 8, "kernelSize": 0}, [3, 32, 32], [8, 30, 30],
     "'L': kernelSize must be a positive integer or a list of them, not 0"),
    ("conv2d", {"inChannels": 6, "outChannels": 9, "kernelSize": 3, "groups": 2}, [6, 8, 8], [9, 6, 6],
     "'L': outChannels 9 is not divisible by groups 2"),
    ("batchNorm", {"numFeatures": 32}, [16, 8, 8], [16, 8, 8],
     "'L': numFeatures 32 does not match its input channels 16"),
    ("layerNorm", {"normalizedShape": [768]}, [128, 512], [128, 512],
     "'L': normalizedShape [768] does not match its input's trailing dims [512]"),
    ("groupNorm", {"numGroups": 5, "numChannels": 16}, [16, 8, 8], [16, 8, 8],
     "'L': numChannels 16 is not divisible by numGroups 5"),
    ("multiHeadAttention", {"hiddenDim": 100, "numHeads": 8}, [10, 100], [10, 100],
     "'L': hiddenDim 100 is not divisible by numHeads 8"),
    ("groupedQueryAttention", {"embedDim": 512, "numHeads": 8, "numKVHeads": 3}, [10, 512], [10, 512],
     "'L': numHeads 8 is not divisible by numKVHeads 3"),
    ("dropout", {"p": 1.0}, [10], [10], "'L': p must be a probability in [0, 1), not 1.0"),
    ("dropout", {"p": -0.1}, [10], [10], "'L': p must be a probability in [0, 1), not -0.1"),
    ("lstm", {"inputSize": 32, "hiddenSize": 64}, [5, 16], [5, 64],
     "'L': inputSize 32 does not match its input's last dim 16"),
    ("embedding", {"vocabSize": 100, "embeddingDim": 32}, [7], [7, 64],
     "'L': embeddingDim 32 does not match its output's last dim 64"),
])
def test_per_type_blockers(type_: str, params: dict, inp: list, out: list, blocker: str) -> None:
    assert plan_of(_one_layer(type_, params, inp, out))["run"]["blockers"] == [blocker]


def test_malformed_shapes_are_blockers() -> None:
    doc = _one_layer("relu", {}, [4], [4])
    doc["components"][1]["outputShape"] = [[4]]
    doc["components"][1]["inputShape"] = [0, 4]
    assert plan_of(doc)["run"]["blockers"] == [
        "'L': inputShape has a dimension that is not positive",
        "'L': outputShape is not a flat list of integers",
    ]


def test_edge_shape_mismatch_is_a_blocker() -> None:
    # conv1 gives 32 channels; bn1 says (consistently with its own params) it receives 64
    doc = graph("Edge", [
        node("x", "input", {"shape": [3, 8, 8]}, out=[3, 8, 8]),
        node("conv1", "conv2d", {"inChannels": 3, "outChannels": 32, "kernelSize": 1, "bias": False},
             [3, 8, 8], [32, 8, 8]),
        node("bn1", "batchNorm", {"numFeatures": 64}, [64, 8, 8], [64, 8, 8]),
        node("y", "output", inp=[64, 8, 8]),
    ])
    assert plan_of(doc)["run"]["blockers"] == [
        "'bn1': inputShape [64, 8, 8] does not match 'conv1''s outputShape [32, 8, 8]"]


def test_functional_code_between_layers_raises_no_false_blocker() -> None:
    """Shapes that differ along an edge in real traced models because of functional code."""
    doc = graph("Functional", [
        node("x", "input", {"shape": [3, 224, 224]}, out=[3, 224, 224]),
        # ViT: conv patches [768,14,14] -> flatten/transpose/cat cls token -> [197,768]
        node("patch", "conv2d", {"inChannels": 3, "outChannels": 768, "kernelSize": 16, "stride": 16},
             [3, 224, 224], [768, 14, 14]),
        node("ln0", "layerNorm", {"normalizedShape": 768}, [197, 768], [197, 768]),
        # GPT-2: fused c_attn [L,2304] split into q,k,v; attention is functional; c_proj sees [L,768]
        node("c_attn", "linear", {"inFeatures": 768, "outFeatures": 2304}, [197, 768], [197, 2304]),
        node("c_proj", "linear", {"inFeatures": 768, "outFeatures": 768}, [197, 768], [197, 768]),
        # BERT pooler: hidden[:, 0] -> [768]
        node("pooler", "linear", {"inFeatures": 768, "outFeatures": 768}, [768], [768]),
        node("act", "tanh", {}, [768], [768]),
        node("drop", "dropout", {"p": 0.1}, [768], [768]),
        # ResNet: avgpool [768,1,1] would be flattened functionally before fc
        node("pool", "adaptiveAvgPool2d", {"outputSize": 1}, [768], [768, 1, 1]),
        node("fc", "linear", {"inFeatures": 768, "outFeatures": 10}, [768], [10]),
        node("y", "output", inp=[10]),
    ])
    plan = plan_of(doc)
    assert plan["run"]["blockers"] == []
    assert plan["run"]["legal"] is True


def test_synthetic_connections_keep_the_graph_clean_but_carry_no_shape() -> None:
    doc = graph("Synthetic", [
        node("x", "input", {"shape": [4]}, out=[4]),
        node("fc", "linear", {"inFeatures": 4, "outFeatures": 4}, [4], [4]),
        node("const", "linear", {"inFeatures": 9, "outFeatures": 4}, [9], [4]),  # fed by a constant
        node("y", "output", inp=[4]),
    ], edges=[("x", "fc"), ("fc", "y"), ("x", "const"), ("const", "y")])
    doc["measured"] = {"syntheticConnections": ["e2"]}
    plan = plan_of(doc)
    assert plan["run"]["blockers"] == []


def test_real_sized_graphs_have_no_blockers() -> None:
    resnet = plan_of(load("resnet50"))
    assert resnet["run"]["blockers"] == []
    # ResNet-50's published parameter count, from the estimator alone
    assert resnet["model"]["params"] == 25_557_032
    # torchvision quotes 4.09 GMACs; 2 FLOPs per multiply-add
    assert resnet["model"]["flops"] == 8_178_368_512
    assert resnet["warnings"] == []
    llama = plan_of(load("llama7b"))
    assert llama["run"]["blockers"] == [] and llama["warnings"] == []
    # LLaMA-7B's published parameter count, from the graph's measured totals
    assert llama["model"]["params"] == 6_738_415_616
    # 18 B/param alone is 121 GB; x1.15 passes the H200: no single card, a ZeRO cluster
    assert all(card["batch"] == 0 for card in llama["fit"]["cards"])
    assert llama["fit"]["gpus"] > 1 and llama["fit"]["strategy"].startswith("zero")


#: Graphs recorded from neurarch-trace 0.1.0 (``trace_model``) on real model code at batch 2:
#: Hugging Face BertForSequenceClassification, GPT2LMHeadModel, LlamaForCausalLM (GQA, 4 heads /
#: 2 KV heads), T5ForConditionalGeneration and ViTForImageClassification, tiny configs with
#: random weights on 16 token ids or 3x32x32; examples/models/resnet.py's ResNet18 (3x64x64) and
#: ResNet50 (3x224x224). Recorded files, so these tests need neither torch nor the tracer.
TRACED = ["bert", "gpt2", "llama", "t5", "vit", "resnet18", "resnet50"]


@pytest.mark.parametrize("name", TRACED)
def test_recorded_traces_have_no_false_blockers(name: str) -> None:
    doc = load(f"traced_{name}")
    plan = plan_of(doc)
    measured = doc["measured"]
    assert plan["run"]["blockers"] == [] and plan["run"]["legal"] is True
    assert plan["model"]["params"] == measured["params"]
    assert plan["model"]["flops"] == measured["flops"] // measured["batchSize"]
    assert (plan["model"]["paramsSource"], plan["model"]["flopsSource"]) == ("measured", "measured")
    text = make_plan(doc)["text"]
    assert not any("estimated" in line for line in text.splitlines()[:4])  # the counts are measured
    # recorded by neurarch-trace 0.1.0, before the training-step rehearsal: memory from the formula
    assert plan["memory"]["source"] == "estimated"
    assert row("", "estimated from layer outputs (no measured step)") in text.splitlines()


def _strip_measured(doc: Dict[str, Any]) -> Dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc.pop("measured", None)
    for comp in doc["components"]:
        comp.pop("measured", None)
    return doc


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "bert", "gpt2"])
def test_estimator_agrees_with_the_tracer(name: str) -> None:
    """Without the measured fields the estimator reproduces the tracer's parameters exactly and
    its layer FLOPs exactly; what it cannot see is the attention matmuls in functional code."""
    doc = load(f"traced_{name}")
    measured = doc["measured"]
    plan = plan_of(_strip_measured(doc))
    assert plan["model"]["params"] == measured["params"]
    assert plan["model"]["flops"] == measured["layerFlops"] // measured["batchSize"]
    assert plan["model"]["flops"] == (measured["flops"] - measured["functionalFlops"]) // measured["batchSize"]
    if name.startswith("resnet"):
        assert measured["functionalFlops"] == 0
    assert plan["run"]["blockers"] == []


def test_hand_edits_of_a_traced_graph_are_caught() -> None:
    doc = load("traced_llama")
    names = {comp["name"]: comp for comp in doc["components"]}
    names["model.layers.0.self_attn.q_proj"]["params"]["inFeatures"] = 32
    names["model.layers.1.post_attention_layernorm"]["params"]["normalizedShape"] = 48
    assert plan_of(doc)["run"]["blockers"] == [
        "'model.layers.0.self_attn.q_proj': inFeatures 32 does not match its input's last dim 64",
        "'model.layers.1.post_attention_layernorm': normalizedShape [48] does not match its input's "
        "trailing dims [64]",
    ]


# --- warnings -------------------------------------------------------------------------------------


def test_each_warning_rule() -> None:
    doc = graph("Lint", [
        node("x", "input", {"shape": [3, 8, 8]}, out=[3, 8, 8]),
        node("conv", "conv2d", {"inChannels": 3, "outChannels": 4, "kernelSize": 1}, [3, 8, 8], [4, 8, 8]),
        node("bn", "batchNorm", {"numFeatures": 4}, [4, 8, 8], [4, 8, 8]),
        node("relu", "relu", {}, [4, 8, 8], [4, 8, 8]),
        node("gn", "groupNorm", {"numGroups": 2, "numChannels": 4}, [4, 8, 8], [4, 8, 8]),
        node("blob", "customModule", {"className": "Blob", "paramCount": 7}, [4, 8, 8], [4, 8, 8]),
        node("soft", "softmax", {}, [4, 8, 8], [4, 8, 8]),
        node("y", "output", inp=[4, 8, 8]),
    ])
    plan = plan_of(doc)
    # most severe first: the softmax breaks training, the unknown cost the plan's own numbers
    assert plan["warnings"] == [
        "a softmax at the output: 'soft' (CrossEntropyLoss expects logits)",
        "a layer of unknown cost: 'blob' (customModule Blob)",
        "a bias right before a BatchNorm: 'conv' feeds 'bn', which cancels it",
        "a norm right after an activation: 'gn' follows 'relu'",
    ]
    assert [(w["code"], w["severity"]) for w in plan["warningDetails"]] == [
        ("softmax-at-output", "high"), ("unknown-cost", "medium"), ("bias-before-batchnorm", "low"),
        ("norm-after-activation", "low")]
    # customModule's paramCount still counts: conv 4*3 + 4 = 16, bn 8, gn 8, blob 7
    assert plan["model"]["params"] == 39
    lines = make_plan(doc)["text"].splitlines()
    assert row("Warnings", "4: a softmax at the output: 'soft'") in lines


def test_deep_plain_net_warns_and_residual_silences_it() -> None:
    comps = [node("x", "input", {"shape": [8]}, out=[8])]
    for i in range(8):
        comps.append(node(f"fc{i}", "linear", {"inFeatures": 8, "outFeatures": 8}, [8], [8]))
    comps.append(node("y", "output", inp=[8]))
    plain = graph("Plain", comps)
    assert plan_of(plain)["warnings"] == ["8 weight layers in a row with no residual path"]
    edges = [(a["id"], b["id"]) for a, b in zip(comps, comps[1:])] + [("fc0", "fc7")]
    assert plan_of(graph("Skip", comps, edges))["warnings"] == []
    seven = graph("Seven", comps[:1] + comps[2:])
    assert plan_of(seven)["warnings"] == []


# --- diff -----------------------------------------------------------------------------------------


def test_diff_against_base() -> None:
    base = load("mlp")
    new = copy.deepcopy(base)
    comps = {c["id"]: c for c in new["components"]}
    comps["fc1"]["params"]["outFeatures"] = 512
    comps["fc1"]["outputShape"] = [512]
    for name in ("act", "drop"):
        comps[name]["inputShape"] = comps[name]["outputShape"] = [512]
    comps["fc2"]["params"]["inFeatures"] = 512
    comps["fc2"]["inputShape"] = [512]
    comps["act"]["name"] = "gelu"
    comps["act"]["type"] = "gelu"
    new["name"] = "MLP-wide"
    plan = plan_of(new, base=base)
    d = plan["diff"]
    # fc1 784*512 + 512 = 401,920; fc2 512*10 + 10 = 5,130 -> 407,050 vs 203,530
    assert d["params"] == {"base": 203_530, "new": 407_050, "delta": 203_520}
    # fc1 2*784*512 = 802,816; fc2 2*512*10 = 10,240 -> 813,056 vs 406,528
    assert d["flops"] == {"base": 406_528, "new": 813_056, "delta": 406_528}
    # same batch for both (the new plan's, 1024); static +203,520*18; per sample +3*256*2 +0
    assert d["peakGb"]["batch"] == 1024
    assert d["peakGb"]["delta"] == pytest.approx((203_520 * 18 + 1024 * 3 * 256 * 2) / 1e9, rel=1e-9)
    assert d["costUsd"]["delta"] == pytest.approx(3 * 406_528 * 1e6 / T4_EFFECTIVE_FLOPS * T4_USD_PER_S, rel=1e-9)
    assert d["layers"] == {"added": ["gelu"], "removed": ["act"],
                           "changed": [{"name": "fc1", "fields": ["params", "outputShape"]},
                                       {"name": "drop", "fields": ["inputShape", "outputShape"]},
                                       {"name": "fc2", "fields": ["params", "inputShape"]}]}
    # an input of another size: the input and output nodes are no layers, changed or not
    narrow = copy.deepcopy(base)
    for c in narrow["components"]:
        if c["id"] == "in":
            c["outputShape"] = [392]
        elif c["id"] == "fc1":
            c["inputShape"], c["params"]["inFeatures"] = [392], 392
    assert plan_of(narrow, base=base)["diff"]["layers"] == {
        "added": [], "removed": [], "changed": [{"name": "fc1", "fields": ["params", "inputShape"]}]}
    text = make_plan(new, base=base)["text"].splitlines()
    # every line of the diff box, padded by the card's own rule (row)
    assert text[-7:] == [
        row("Diff vs base", "MLP"),
        row("Params", "+203.5K (203.5K -> 407.1K)"),
        row("FLOPs", "+406.5 KFLOPs (406.5 KFLOPs -> 813.1 KFLOPs)"),
        row("Peak memory", "+0.01 GB at batch 1,024 (1.0 GB -> 1.0 GB)"),  # +5,236,224 B
        row("Cost", "+$0.00 per million samples (<$0.01 -> <$0.01)"),
        row("Layers", "1 added, 1 removed, 3 changed"),
        "+------------------------------------------------------------------+",
    ]


@pytest.mark.parametrize("options", [{"finetune": "lora", "gpu": "L40S"}, {}, {"gpu": "A100-80x4"},
                                     {"finetune": "qlora"}])
def test_the_diff_sizes_the_base_on_the_cards_own_setup(options) -> None:
    # it compared full training on one GPU whatever the card sized: 137.5 -> 162.5 GB under a
    # LoRA fit on an L40S (a new-user pass, 2026-12-04)
    new, base = load("llama7b"), load("traced_llama")
    plan = plan_of(new, base=base, **options)
    fit, peak, cost = plan["fit"], plan["diff"]["peakGb"], plan["diff"]["costUsd"]
    assert (peak["batch"], peak["gpus"], peak["finetune"]) == (fit["batch"], fit["gpus"], fit["mode"])
    assert peak["strategy"] == fit["strategy"] + ("+ckpt" if fit["checkpointing"] else "")
    assert peak["new"] == pytest.approx(fit["peakGb"], rel=1e-12)
    # the base on the same setup: its own plan's line (one GPU, no checkpointing for a tiny model)
    # at the card's batch; on more GPUs its states divide as the strategy divides them
    # (at the card's 2,048 tokens per sample, not the 16 it was traced at)
    own = plan_of(base, seq_len=2048, **{k: v for k, v in options.items() if k != "gpu"})["cost"]
    if fit["gpus"] == 1:
        assert peak["base"] == pytest.approx(own["staticGb"] + fit["batch"] * own["perSampleGb"], rel=1e-9)
    assert peak["base"] < 1.05  # 86.8K parameters and the 1 GB CUDA context
    assert (cost["gpu"], cost["gpus"]) == (fit["gpu"], fit["gpus"])
    assert cost["new"] == pytest.approx(plan["cost"]["training"]["usd"], rel=1e-9)
    line = next(line for line in make_plan(new, base=base, **options)["text"].splitlines()
                if line.startswith("| Peak memory"))
    assert f"{'per GPU ' if fit['gpus'] > 1 else ''}at batch {fit['batch']:,} (1.0 GB -> " in line


def flat(card: str) -> str:
    """A card's text without its box: continuation rows joined to the row they continue."""
    return " ".join(line.strip("|").strip() for line in card.splitlines())


def test_the_diff_reads_the_base_at_the_cards_length_mode_and_cluster() -> None:
    new, base = load("llama7b"), load("traced_llama")
    # a base traced at another length (16 tokens) is read at the card's 2,048: per-token costs
    # compare (it was priced as if its 16-token sample held 2,048 tokens: 128x too cheap)
    assert plan_of(base)["model"]["input"]["tracedTokens"] != 2048
    read = plan_of(new, base=base)["diff"]
    at_2048 = plan_of(new, base=base, seq_len=2048)["diff"]
    assert read["costUsd"]["base"] == pytest.approx(at_2048["costUsd"]["base"], rel=1e-12)
    assert read["peakGb"]["base"] == pytest.approx(at_2048["peakGb"]["base"], rel=1e-12)
    # LoRA on a ResNet-50 (no linear layers to adapt but its head) plans full training: the base is
    # sized in the mode the card applied, and the card says when the base takes another
    vit, resnet = load("traced_vit"), load("traced_resnet50")
    plan = make_plan(vit, base=resnet, finetune="lora")
    d = plan["plan"]["diff"]
    assert d["finetune"] == {"new": plan["plan"]["fit"]["mode"], "base": d["finetune"]["base"]}
    if d["finetune"]["base"] != d["finetune"]["new"]:
        assert "the base is sized for full training: LoRA does not apply" in flat(plan["text"])
    # a setup that fits nothing: no cost, and the peaks compare on the cluster the card names
    plan = make_plan(new, base=base, gpu="T4x1", seq_len=8192)
    d, fit = plan["plan"]["diff"], plan["plan"]["fit"]
    assert not fit["fits"] and d["costUsd"] is None
    assert d["peakGb"]["gpus"] == fit["needs"]["gpus"] and d["peakGb"]["new"] == pytest.approx(fit["needs"]["peakGb"])
    assert row("Cost", "n/a, as the card's") in plan["text"].splitlines()
    # a base with blockers, and a base whose peak is estimated: the card says so
    broken = load("mlp")
    for c in broken["components"]:
        if c["id"] == "fc2":
            c["params"]["inFeatures"] = 300
    assert "the base has 1 blocker: sized as drawn" in flat(make_plan(load("mlp"), base=broken)["text"])
    # (a measured base against an estimated one: tests/test_rehearsal.py)


# --- the card's shape and bad input --------------------------------------------------------------


def test_every_card_line_fits_68_columns() -> None:
    long = load("mlp")
    long["name"] = "A" * 200
    long["components"][1]["name"] = "encoder.layer.0.attention.self.query.a.very.long.name" * 3
    long["components"][1]["params"]["inFeatures"] = 7
    docs = [load("mlp"), load("tiny_cnn"), load("resnet50"), load("llama7b"), long, _big_linear(100_000, 100_000)]
    for doc in docs:
        source = {"target": "some/really/long/path/" * 6 + "model.py:Net"}
        text = make_plan(doc, source=source, base=load("mlp"))["text"]
        for line in text.splitlines():
            assert len(line) == WIDTH, line


def test_one_token_is_one_token() -> None:
    out = make_plan(load("traced_gpt2"), seq_len=1)
    text = out["text"] + json.dumps(out["plan"])
    assert "1 tokens" not in text and "at 1 token " in out["text"]
    assert "1 token per sample" in out["plan"]["cost"]["assumptions"]


def test_target_label() -> None:
    assert target_label("models/resnet.py:ResNet18") == "models/resnet.py"
    assert target_label("torchvision.models:resnet18") == "torchvision.models"
    assert target_label("pkg.mod:Outer.Inner") == "pkg.mod"
    assert target_label("hf:bert-base-uncased") == "hf:bert-base-uncased"
    assert target_label("hf:tiny_model") == "hf:tiny_model"  # a folder named like an identifier: was "hf"
    assert target_label("") is None


@pytest.mark.parametrize("doc, sentence", [
    ([], "model is not a graph: it must be a JSON object"),
    ({"components": []}, "model is not a graph: it needs 'components' and 'connections' arrays"),
    ({"components": [{"name": "x"}], "connections": []}, "model is not a graph: component 0 has no string 'id'"),
])
def test_not_a_graph(doc: Any, sentence: str) -> None:
    with pytest.raises(GraphError) as info:
        make_plan(doc)
    assert str(info.value) == sentence


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        make_plan(load("mlp"), seq_len=0)
    with pytest.raises(ValueError):
        make_plan(load("mlp"), attention="fast")
    with pytest.raises(GraphError, match="^base is not a graph"):
        make_plan(load("mlp"), base={"nope": 1})


def test_hostile_sizes_stay_finite_and_fast() -> None:
    doc = _one_layer("lstm", {"inputSize": 4, "hiddenSize": 4, "numLayers": 2**40}, [3, 4], [3, 4])
    plan = plan_of(doc)  # closed form, not a loop over 2^40 layers
    assert plan["fit"]["fits"] is False
    wide = _one_layer("relu", {}, [4], [4])
    wide["components"][1]["outputShape"] = [2**40] * 60
    assert plan_of(wide)["run"]["blockers"] == ["'L': outputShape has more than 2^53 elements"]


def test_gpu_table_matches_the_spec() -> None:
    table = gpu_table()
    rows = {(c.id, c.memory_gb, c.usd_per_hour) for c in table.cards}
    assert rows == {("T4", 16, 0.59), ("L4", 24, 0.80), ("A10G", 24, 1.10), ("A100-40", 40, 2.10),
                    ("L40S", 48, 1.95), ("A100-80", 80, 2.50), ("H100", 80, 3.95), ("H200", 141, 4.54)}
    assert (table.price_date, table.headroom, table.borderline_fraction) == ("2026-08-19", 1.15, 0.15)
    assert all(c.peak_source for c in table.cards)
    assert [c.id for c in table.cards][:2] == ["T4", "L4"]


def test_planner_and_service_never_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, neurarch_trace.planner, neurarch_trace.server.app; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- a measured training step (measured.training, docs/measured.md) ------------------------------


def _with_training(doc: Dict[str, Any], **overrides: Any) -> Dict[str, Any]:
    """The MLP graph with a rehearsed step of two phase peaks, worked by hand below."""
    doc = copy.deepcopy(doc)
    training = {
        "batchSizes": [2, 4], "tokens": None, "peakPhase": "optimizer",
        "peaks": [
            # the optimizer step: 20 B a parameter's worth of state, the batch alive
            {"phase": "optimizer", "stateBytes": {"masterWeights": 4_000_000, "gradients": 4_000_000,
                                                  "optimizerMoments": 8_000_000, "optimizerTemporaries": 4_000_000},
             "perSampleBytes": {"inputs": 3_136.0}},
            # the start of the backward: the moments, the 16-bit copies and every activation
            {"phase": "backward", "stateBytes": {"weights16": 2_000_000, "masterWeights": 4_000_000,
                                                 "optimizerMoments": 8_000_000},
             "perSampleBytes": {"inputs": 3_136.0, "activations": 100_000.0, "backward": 20_000.0}},
        ],
        "attention": {"sdpaCalls": 0, "kernels": {}, "eagerScoreBytesPerSample": 0.0,
                      "fusedKeptBytesPerSample": 0.0, "eagerExtraBytesPerSample": 0.0},
    }
    training.update(overrides)
    doc.setdefault("measured", {})["training"] = training
    return doc


def test_a_measured_step_is_the_memory_model() -> None:
    plan = plan_of(_with_training(load("mlp")))
    memory = plan["memory"]
    assert memory["source"] == "measured" and memory["reason"] is None
    # optimizer line: 20e6 + 1e9 + b * 3,136; backward line: 14e6 + 1e9 + b * 123,136. They cross at
    # b = 6e6 / 120,000 = 50: the optimizer peaks up to batch 32, the backward from 64 on
    # T4: (1.014e9 + b * 123,136) * 1.15 <= 16e9 up to b = 104,760: the 1024 cap
    assert plan["fit"]["gpu"] == "T4" and plan["fit"]["batch"] == 1024
    assert memory["peakPhase"] == "backward"
    assert plan["cost"]["peakGb"] == pytest.approx((1_014_000_000 + 1024 * 123_136) / 1e9, rel=1e-12)
    assert plan["cost"]["activationGb"] == pytest.approx(1024 * 123_136 / 1e9, rel=1e-12)
    assert plan["cost"]["staticGb"] == pytest.approx(1.014, rel=1e-12)
    breakdown = plan["cost"]["breakdown"]
    assert breakdown["weightsGb"] == pytest.approx(0.002) and breakdown["optimizerGb"] == pytest.approx(0.008)
    assert breakdown["backwardGb"] == pytest.approx(1024 * 20_000 / 1e9)
    assert "measured by rehearsing the step" in plan["cost"]["assumptions"]
    assert "at batch 1024" in plan["cost"]["assumptions"]
    lines = make_plan(_with_training(load("mlp")))["text"].splitlines()
    assert row("", "measured: rehearsed step, peak in the backward") in lines
    assert [p["phase"] for p in memory["phases"]] == ["optimizer", "backward"]
    assert memory["phases"][0]["peakGb"] == pytest.approx((1_020_000_000 + 1024 * 3_136) / 1e9, rel=1e-12)


def test_a_measured_step_sized_for_another_length() -> None:
    """A token model traced at 16 tokens, planned at 64 (r = 4): the per-sample bytes that grow with
    the length squared are scaled by r^2, the others by r; eager attention adds the score matrices
    (r^2) less what the fused kernel kept (r)."""
    doc = _with_training(_token_model(), tokens=[16, 8], flopsSeqSquaredFraction=0.25, peaks=[
        {"phase": "backward", "stateBytes": {"masterWeights": 1_000_000},
         "perSampleBytes": {"inputs": 128.0, "activations": 50_000.0},
         "seqSquaredBytes": {"activations": 10_000.0}}])
    doc["measured"]["training"]["attention"].update(sdpaCalls=1, eagerScoreBytesPerSample=7_000.0,
                                                    fusedKeptBytesPerSample=2_000.0)
    sdpa = plan_of(doc, seq_len=64)
    # inputs 128 * 4 = 512; activations (50,000 - 10,000) * 4 + 10,000 * 16 = 320,000
    assert sdpa["cost"]["perSampleGb"] == pytest.approx((512 + 320_000) / 1e9, rel=1e-12)
    # FLOPs: 2,637,824 traced, 3/4 linear (x4) and 1/4 quadratic (x16): x (0.75 * 4 + 0.25 * 16) = x7
    assert sdpa["model"]["flops"] == pytest.approx(7 * 2_637_824, rel=1e-12)
    assert any("measured attention terms by its square" in note for note in sdpa["notes"])
    eager = plan_of(doc, seq_len=64, attention="eager")
    # + 7,000 * 16 - 2,000 * 4 = 104,000
    assert eager["cost"]["perSampleGb"] == pytest.approx((512 + 320_000 + 104_000) / 1e9, rel=1e-12)


@pytest.mark.parametrize("training, reason", [
    ({"error": "the training step could not be rehearsed on the meta device (RuntimeError: x)"},
     "the training step was not rehearsed: the training step could not be rehearsed on the meta device"),
    ({"peaks": []}, "measured.training.peaks is missing or malformed"),
    ({"peaks": [{"phase": "backward", "stateBytes": {"masterWeights": -1}}]}, "measured.training.peaks is malformed"),
    ({"peaks": [{"phase": "backward", "stateBytes": {"masterWeights": "1e9"}}]},
     "measured.training.peaks is malformed"),
    ({"peaks": [{"phase": "backward", "perSampleBytes": {"activations": float("nan")}}]},
     "measured.training.peaks is malformed"),
    ({"peaks": [{"phase": "backward", "stateBytes": {"weights": 1}}]}, "measured.training.peaks is malformed"),
    ({"peaks": [{"phase": "x"}] * 65}, "measured.training.peaks is missing or malformed"),
    ("not an object", "the graph has no measured training step"),
])
def test_a_malformed_measurement_falls_back_to_the_estimate(training: Any, reason: str) -> None:
    doc = load("mlp")
    doc["measured"] = {"training": training}
    plan = plan_of(doc)
    assert plan["memory"]["source"] == "estimated" and plan["memory"]["reason"].startswith(reason)
    # the estimate, as test_mlp_numbers_by_hand works it out
    assert plan["cost"]["perSampleGb"] == pytest.approx(4_772 / 1e9, rel=1e-12)
    assert row("", "estimated from layer outputs (no measured step)") in make_plan(doc)["text"].splitlines()


def test_flops_by_kind_decide_the_utilisation_at_any_depth() -> None:
    doc = load("tiny_cnn")
    assert plan_of(doc)["cost"]["training"]["mfu"] == 0.20  # by layer type: the conv carries the FLOPs
    doc["measured"] = {"flopsByKind": {"convolution": 10, "matmul": 90}}
    assert plan_of(doc)["cost"]["training"]["mfu"] == 0.40  # the whole-model count wins
    doc["measured"] = {"flopsByKind": {"convolution": 90, "matmul": 10}, "layers": 68}
    plan = plan_of(doc)
    assert plan["cost"]["training"]["mfu"] == 0.20 and plan["model"]["layers"] == 68
