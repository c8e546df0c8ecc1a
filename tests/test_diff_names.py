"""The diff's layers, matched by name across a bare backbone and the same backbone under a task head
(transformers' ``AutoModel`` against ``AutoModelForCausalLM``): traced graphs, not hand-made ones."""

from __future__ import annotations

import pytest
import torch

from neurarch_trace import trace_model
from neurarch_trace.planner import make_plan

transformers = pytest.importorskip("transformers")


def _llama_config():
    return transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)


@pytest.fixture(scope="module")
def llama_graphs():
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (1, 16))
    backbone = trace_model(transformers.LlamaModel(_llama_config()), ids, training_step=False)
    causal = trace_model(transformers.LlamaForCausalLM(_llama_config()), ids, training_step=False)
    return backbone, causal


def _layer_names(graph):
    return [c["name"] for c in graph["components"] if c["type"] not in ("input", "output")]


def test_a_task_head_over_the_same_backbone_adds_its_head_alone(llama_graphs) -> None:
    backbone, causal = llama_graphs
    names = _layer_names(backbone)
    # the two graphs name every backbone layer differently: matched as they are, nothing pairs
    assert {f"model.{n}" for n in names} <= set(_layer_names(causal))
    assert not set(names) & set(_layer_names(causal))
    layers = make_plan(causal, base=backbone)["plan"]["diff"]["layers"]
    assert layers == {"added": ["lm_head"], "removed": [], "changed": [],
                      "prefixes": {"new": "model.", "base": ""}}
    # the other way round: the head is what the backbone lacks
    layers = make_plan(backbone, base=causal)["plan"]["diff"]["layers"]
    assert layers == {"added": [], "removed": ["lm_head"], "changed": [],
                      "prefixes": {"new": "", "base": "model."}}


def test_the_card_says_how_the_names_were_matched(llama_graphs) -> None:
    backbone, causal = llama_graphs
    text = make_plan(causal, base=backbone)["text"]
    assert "1 added, 0 removed, 0 changed" in text
    assert "(matched by name without the new model's" in text and "'model.')" in text


def test_a_changed_layer_is_found_across_the_prefix(llama_graphs) -> None:
    backbone, _ = llama_graphs
    config = _llama_config()
    config.intermediate_size = 256
    torch.manual_seed(0)
    wide = trace_model(transformers.LlamaForCausalLM(config), torch.randint(0, 1000, (1, 16)), training_step=False)
    layers = make_plan(wide, base=backbone)["plan"]["diff"]["layers"]
    assert layers["added"] == ["lm_head"] and layers["removed"] == []
    changed = {c["name"]: c["fields"] for c in layers["changed"]}
    # the MLP's three projections and the activation between them, in both blocks
    for block in (0, 1):
        prefix = f"model.layers.{block}.mlp"
        assert changed[f"{prefix}.gate_proj"] == ["params", "outputShape"]
        assert changed[f"{prefix}.up_proj"] == ["params", "outputShape"]
        assert changed[f"{prefix}.down_proj"] == ["params", "inputShape"]
    assert all(name.startswith("model.layers.") for name in changed)


def test_names_that_match_as_they_are_take_no_prefix(llama_graphs) -> None:
    _, causal = llama_graphs
    layers = make_plan(causal, base=causal)["plan"]["diff"]["layers"]
    assert layers == {"added": [], "removed": [], "changed": []}


def test_bert_under_a_classification_head() -> None:
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=1000, num_labels=3)
    ids = torch.randint(0, 1000, (1, 16))
    torch.manual_seed(0)
    backbone = trace_model(transformers.BertModel(config), ids, training_step=False)
    classifier = trace_model(transformers.BertForSequenceClassification(config), ids, training_step=False)
    layers = make_plan(classifier, base=backbone)["plan"]["diff"]["layers"]
    assert layers["prefixes"] == {"new": "bert.", "base": ""}
    assert layers["removed"] == [] and layers["changed"] == []
    # the head: its dropout and classifier (BertModel's own pooler is under bert. in both)
    assert layers["added"] == ["dropout", "classifier"]


def test_the_same_model_at_another_depth_is_said_to_be_so(llama_graphs) -> None:
    # a new-user pass: full depth against --depth 1 read "62 added, 4 removed" and nothing more
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (1, 16))
    model = transformers.LlamaForCausalLM(_llama_config())
    full = trace_model(model, ids, training_step=False)
    cut = trace_model(model, ids, depth=2, training_step=False)
    layers = make_plan(full, base=cut)["plan"]["diff"]["layers"]
    assert layers["depthOnly"] is True and (layers["added"] or layers["removed"])
    text = " ".join(line.strip("| ").strip() for line in make_plan(full, base=cut)["text"].splitlines())
    assert "(the same model at another --depth: the same layers, parameters and FLOPs at full depth)" in text
    # another model is not: the backbone against the causal model differs in parameters
    backbone, causal = llama_graphs
    assert "depthOnly" not in make_plan(causal, base=backbone)["plan"]["diff"]["layers"]
