"""The card's warnings on traced models (issue 16.6) and a base of another kind (issue 16.7): the
canonical architectures show no warning they do not deserve, a VGG-style net shows its worst one
first, and a diff across kinds compares only what compares."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import load_example
from torch import nn

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan

T = pytest.importorskip("transformers")


def plan(model: nn.Module, x, **kwargs) -> dict:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_plan(trace_model(model, x), **kwargs)


def ids() -> torch.Tensor:
    return torch.randint(0, 100, (1, 16))


CANONICAL = {
    "ResNet-18": lambda: (load_example("resnet").ResNet18(), torch.randn(1, 3, 64, 64)),
    "ResNet-50": lambda: (load_example("resnet").ResNet50(), torch.randn(1, 3, 64, 64)),
    "ViT": lambda: (load_example("vit").ViT_Tiny(), torch.randn(1, 3, 32, 32)),
    "GPT (example)": lambda: (load_example("gpt").TinyGPT(), ids()),
    "BERT": lambda: (T.BertModel(T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=128, vocab_size=100)), ids()),
    "BERT classifier": lambda: (T.BertForSequenceClassification(T.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100)), ids()),
    "GPT-2": lambda: (T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100,
                                                     n_positions=64, bos_token_id=0, eos_token_id=0)), ids()),
    "LLaMA": lambda: (T.LlamaForCausalLM(T.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=2, intermediate_size=128,
                                                       vocab_size=100)), ids()),
    "ViT classifier": lambda: (T.ViTForImageClassification(T.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8)), torch.randn(1, 3, 32, 32)),
    "ResNet classifier": lambda: (T.ResNetForImageClassification(T.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])), torch.randn(1, 3, 64, 64)),
}


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_canonical_architectures_get_no_warning(name):
    model, x = CANONICAL[name]()
    answer = plan(model, x)
    assert answer["plan"]["warnings"] == []
    assert "| Warnings        none" in answer["text"]


def vgg(softmax: bool = True) -> nn.Sequential:
    """VGG-16's convolutions (Simonyan and Zisserman 2015, configuration D) on 32 px images, a
    two-layer classifier and, the mistake, a softmax at the output."""
    layers, channels = [], 3
    for width in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if width == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
            channels = width
    layers += [nn.Flatten(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)]
    return nn.Sequential(*layers, *([nn.Softmax(-1)] if softmax else []))


def test_a_vgg_style_net_shows_its_most_severe_warning_first():
    answer = plan(vgg(), torch.randn(1, 3, 32, 32))
    details = answer["plan"]["warningDetails"]
    assert [(d["code"], d["severity"]) for d in details] == [
        ("softmax-at-output", "high"), ("deep-without-residual", "high")]
    assert details[0]["message"] == "a softmax at the output: '35' (CrossEntropyLoss expects logits)"
    assert details[1]["message"] == "15 weight layers in a row with no residual path"  # 13 convs, 2 linears
    assert "| Warnings        2: a softmax at the output: '35'" in answer["text"]
    assert [d["code"] for d in plan(vgg(softmax=False), torch.randn(1, 3, 32, 32))["plan"]["warningDetails"]] == [
        "deep-without-residual"]


@pytest.mark.slow  # seconds: the full run's
def test_a_base_of_another_kind_compares_parameters_and_layers_only():
    resnet, image = CANONICAL["ResNet-18"]()
    gpt2, tokens = CANONICAL["GPT-2"]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = trace_model(gpt2, tokens)
    answer = plan(resnet, image, base=base)
    diff = answer["plan"]["diff"]
    assert diff["comparable"] is False
    assert diff["kinds"] == {"new": "image", "base": "tokens"}
    assert diff["costUsd"] is None and diff["flops"] is None and diff["peakGb"] is None
    assert diff["params"]["base"] == sum(p.numel() for p in gpt2.parameters())
    assert diff["params"]["new"] == sum(p.numel() for p in resnet.parameters())
    text = answer["text"]
    assert "per epoch of ImageNet-1k (" not in text.split("Diff vs base")[1]  # no cost in the other's unit
    assert "| Compared        parameters and layers only: the models differ in |" in text
    assert "kind (images vs token sequences)" in text
    # one kind: every delta, cost in the one unit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same = trace_model(load_example("resnet").ResNet50(), image)
    diff = plan(resnet, image, base=same)["plan"]["diff"]
    assert diff["comparable"] is True and diff["costUsd"]["unit"] == "imagenet-1k-epoch"  # 64 px
    assert diff["flops"]["delta"] < 0 and diff["peakGb"]["delta"] < 0
