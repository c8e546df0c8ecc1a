"""A sweep over transformers architectures built from small configs: every graph is clean, its
parameter total is PyTorch's, every parameter is owned by a node, and every FLOP is counted.

The architectures cover encoder, decoder and encoder-decoder language models (tied and untied
heads, grouped-query attention, ALiBi, parallel blocks, mixture of experts, cross-layer sharing),
vision transformers with windows and relative position biases, convnets, and an audio model."""

from __future__ import annotations

import warnings

import pytest
import torch

T = pytest.importorskip("transformers")

from graph_checks import assert_clean  # noqa: E402

from neurarch_trace import trace_model  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=120)


def ids(length: int = 16) -> dict:
    return {"input_ids": torch.randint(3, 100, (1, length))}


def image(side: int) -> dict:
    return {"pixel_values": torch.randn(1, 3, side, side)}


CASES = {
    "distilbert": (lambda: T.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=120), ids),
    "roberta": (lambda: T.RobertaConfig(**SMALL, pad_token_id=1), ids),
    "albert": (lambda: T.AlbertConfig(embedding_size=32, **SMALL), ids),
    "mistral": (lambda: T.MistralConfig(**SMALL, num_key_value_heads=2), ids),
    "qwen2": (lambda: T.Qwen2Config(**SMALL, num_key_value_heads=2), ids),
    "gemma": (lambda: T.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=16), ids),
    "phi": (lambda: T.PhiConfig(**SMALL), ids),
    "gpt_neox": (lambda: T.GPTNeoXConfig(**SMALL), ids),
    "opt": (lambda: T.OPTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
                                vocab_size=120, word_embed_proj_dim=64), ids),
    "bloom": (lambda: T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=120), ids),
    "falcon": (lambda: T.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=120), ids),
    "mixtral": (lambda: T.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2), ids),
    "bart": (lambda: T.BartConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                  vocab_size=120), ids),
    "t5": (lambda: T.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=120,
                              decoder_start_token_id=0),
           lambda: {**ids(), "decoder_input_ids": torch.randint(3, 100, (1, 8))}),
    "vit": (lambda: T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                image_size=32, patch_size=8), lambda: image(32)),
    "clip_vision": (lambda: T.CLIPVisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               intermediate_size=128, image_size=32, patch_size=8), lambda: image(32)),
    "swin": (lambda: T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                  window_size=4), lambda: image(32)),
    "convnext": (lambda: T.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]), lambda: image(64)),
    "resnet": (lambda: T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
               lambda: image(64)),
    "segformer": (lambda: T.SegformerConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], decoder_hidden_size=32),
                  lambda: image(64)),
    "whisper": (lambda: T.WhisperConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                        num_mel_bins=16, vocab_size=120, max_source_positions=32, pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                lambda: {"input_features": torch.randn(1, 16, 64), "decoder_input_ids": torch.randint(3, 100, (1, 8))}),
}


#: Architectures whose build and trace take seconds: the full run's (``-m slow``).
SLOW_CASES = {"albert", "bart", "bloom"}


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW_CASES else a
                                  for a in sorted(CASES)])
def test_architecture(arch: str) -> None:
    make_config, make_inputs = CASES[arch]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = T.AutoModel.from_config(make_config())
        graph = trace_model(model, make_inputs())
    assert_clean(graph)
    measured = graph["measured"]
    assert measured["params"] == sum(p.numel() for p in model.parameters())
    assert measured["unusedParams"] == 0
    assert sum(c["measured"].get("params", 0) for c in graph["components"]) == measured["params"]
    assert measured["uncountedOps"] == []
    assert all(c["measured"].get("flops", 0) is not None for c in graph["components"])
    assert measured["flops"] > 0
