"""Synthetic graphs the size of real models, shaped like the tracer's output, for bench and tests.

* :func:`resnet50_graph`: torchvision's ResNet-50 (v1.5, stride on the 3x3 conv) at 3x224x224,
  one node per leaf layer plus an ``add`` node per residual merge; no ``measured`` fields, so the
  planner estimates. Its parameter count is ResNet-50's published 25,557,032.
* :func:`llama7b_graph`: LLaMA-7B (32 layers, width 4096, 32 heads, SwiGLU 11008, vocabulary
  32000) at 2048 tokens, decomposed as Hugging Face's ``LlamaForCausalLM`` traces (q/k/v/o
  projections, attention in functional code), with the tracer's ``measured`` fields filled in as
  it would write them at batch 1. Its parameter count is LLaMA-7B's 6,738,415,616.

``python bench/synthetic.py --write tests/data`` rewrites the copies the tests read.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["llama7b_graph", "resnet50_graph"]


class _Builder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.components: List[Dict[str, Any]] = []
        self.connections: List[Dict[str, Any]] = []

    def node(self, name: str, type_: str, params: Dict[str, Any], inputs: Sequence[str],
             in_shape: Optional[List[int]], out_shape: Optional[List[int]], **extra: Any) -> str:
        comp: Dict[str, Any] = {"id": name, "name": name, "type": type_, "params": params}
        if "." in name:
            comp["scope"] = name.rsplit(".", 1)[0]
        if in_shape is not None:
            comp["inputShape"] = in_shape
        if out_shape is not None:
            comp["outputShape"] = out_shape
        comp["position"] = {"x": 0, "y": 80 * len(self.components)}
        comp["inputs"] = list(inputs)
        comp["outputs"] = []
        comp.update(extra)
        self.components.append(comp)
        by_id = {c["id"]: c for c in self.components}
        for src in inputs:
            self.connections.append({"id": f"e{len(self.connections)}", "from": src, "to": name,
                                     "fromPort": "bottom", "toPort": "top"})
            by_id[src]["outputs"].append(name)
        return name

    def doc(self, **extra: Any) -> Dict[str, Any]:
        return {"id": self.name.lower(), "name": self.name, "description": "synthetic",
                "components": self.components, "connections": self.connections, **extra}


def resnet50_graph() -> Dict[str, Any]:
    """ResNet-50 at 3x224x224 (no measured fields)."""
    g = _Builder("ResNet50")
    x = g.node("x", "input", {"shape": [3, 224, 224]}, [], None, [3, 224, 224])

    def conv(name: str, src: str, c_in: int, c_out: int, k: int, s: int, hw_in: int) -> tuple:
        pad = k // 2
        hw_out = (hw_in + 2 * pad - k) // s + 1
        g.node(name, "conv2d", {"inChannels": c_in, "outChannels": c_out, "kernelSize": k, "stride": s,
                                "padding": pad, "bias": False}, [src], [c_in, hw_in, hw_in], [c_out, hw_out, hw_out])
        return name, hw_out

    def bn(name: str, src: str, c: int, hw: int) -> str:
        return g.node(name, "batchNorm", {"numFeatures": c}, [src], [c, hw, hw], [c, hw, hw])

    def relu(name: str, src: str, c: int, hw: int) -> str:
        return g.node(name, "relu", {}, [src], [c, hw, hw], [c, hw, hw])

    cur, hw = conv("conv1", x, 3, 64, 7, 2, 224)
    cur = relu("relu", bn("bn1", cur, 64, hw), 64, hw)
    g.node("maxpool", "maxpool2d", {"kernelSize": 3, "stride": 2, "padding": 1}, [cur], [64, hw, hw], [64, 56, 56])
    cur, hw, c_in = "maxpool", 56, 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            stride = 2 if block == 0 and stage > 1 else 1
            a, hw1 = conv(f"{p}.conv1", cur, c_in, width, 1, 1, hw)
            a = relu(f"{p}.relu1", bn(f"{p}.bn1", a, width, hw1), width, hw1)
            b, hw2 = conv(f"{p}.conv2", a, width, width, 3, stride, hw1)
            b = relu(f"{p}.relu2", bn(f"{p}.bn2", b, width, hw2), width, hw2)
            c, _ = conv(f"{p}.conv3", b, width, width * 4, 1, 1, hw2)
            c = bn(f"{p}.bn3", c, width * 4, hw2)
            identity = cur
            if block == 0:
                d, _ = conv(f"{p}.downsample.0", cur, c_in, width * 4, 1, stride, hw)
                identity = bn(f"{p}.downsample.1", d, width * 4, hw2)
            shape = [width * 4, hw2, hw2]
            s = g.node(f"{p}.add", "add", {}, [c, identity], shape, shape)
            cur = relu(f"{p}.relu3", s, width * 4, hw2)
            hw, c_in = hw2, width * 4
    g.node("avgpool", "adaptiveAvgPool2d", {"outputSize": 1}, [cur], [2048, 7, 7], [2048, 1, 1])
    g.node("flatten", "flatten", {}, ["avgpool"], [2048, 1, 1], [2048])
    g.node("fc", "linear", {"inFeatures": 2048, "outFeatures": 1000}, ["flatten"], [2048], [1000])
    g.node("output", "output", {}, ["fc"], [1000], None)
    return g.doc()


def llama7b_graph(seq: int = 2048) -> Dict[str, Any]:
    """LLaMA-7B at ``seq`` tokens, batch 1, with the tracer's measured fields."""
    width, inner, vocab, layers = 4096, 11008, 32000, 32  # 32 heads: the attention is functional
    g = _Builder("LlamaForCausalLM-7B")
    hidden = [seq, width]
    fp32 = 4

    def measured(params: int, flops: int, shape: List[int], dtype: str = "float32") -> Dict[str, Any]:
        elements = 1
        for d in shape:
            elements *= d
        size = 8 if dtype == "int64" else fp32
        return {"params": params, "buffers": 0, "flops": flops, "outputDtype": dtype,
                "outputBytes": elements * size, "outputShapes": [shape]}

    def linear(name: str, src: Sequence[str], fan_in: int, fan_out: int) -> str:
        return g.node(name, "linear", {"inFeatures": fan_in, "outFeatures": fan_out, "bias": False}, src,
                      [seq, fan_in], [seq, fan_out],
                      measured=measured(fan_in * fan_out, 2 * seq * fan_in * fan_out, [seq, fan_out]))

    def rms(name: str, src: str) -> str:
        return g.node(name, "rmsNorm", {"normalizedShape": width}, [src], hidden, hidden,
                      measured=measured(width, 0, hidden))

    ids = g.node("input_ids", "input", {"shape": [seq]}, [], None, [seq],
                 measured={"params": 0, "buffers": 0, "flops": 0, "outputDtype": "int64",
                           "outputBytes": seq * 8, "outputShapes": [[seq]]})
    cur = g.node("model.embed_tokens", "embedding", {"vocabSize": vocab, "embeddingDim": width}, [ids], [seq], hidden,
                 measured=measured(vocab * width, 0, hidden))
    functional = 0
    for i in range(layers):
        p = f"model.layers.{i}"
        normed = rms(f"{p}.input_layernorm", cur)
        q = linear(f"{p}.self_attn.q_proj", [normed], width, width)
        k = linear(f"{p}.self_attn.k_proj", [normed], width, width)
        v = linear(f"{p}.self_attn.v_proj", [normed], width, width)
        o = linear(f"{p}.self_attn.o_proj", [q, k, v], width, width)
        functional += 4 * seq * seq * width  # QK^T and scores x V, in the attention's forward
        res = g.node(f"{p}.add_1", "add", {}, [cur, o], hidden, hidden, measured=measured(0, 0, hidden))
        normed = rms(f"{p}.post_attention_layernorm", res)
        gate = linear(f"{p}.mlp.gate_proj", [normed], width, inner)
        act = g.node(f"{p}.mlp.act_fn", "swish", {}, [gate], [seq, inner], [seq, inner],
                     measured=measured(0, 0, [seq, inner]))
        up = linear(f"{p}.mlp.up_proj", [normed], width, inner)
        down = linear(f"{p}.mlp.down_proj", [act, up], inner, width)
        cur = g.node(f"{p}.add_2", "add", {}, [res, down], hidden, hidden, measured=measured(0, 0, hidden))
    cur = rms("model.norm", cur)
    head = linear("lm_head", [cur], width, vocab)
    g.node("logits", "output", {}, [head], [seq, vocab], None)
    doc = g.doc()
    layer_flops = sum(c["measured"]["flops"] for c in doc["components"] if "measured" in c)
    params = sum(c["measured"]["params"] for c in doc["components"] if "measured" in c)
    activation = sum(c["measured"]["outputBytes"] for c in doc["components"] if "measured" in c)
    doc["measured"] = {
        "tool": "neurarch-trace/0.1.0", "device": "meta", "batchSize": 1,
        "inputs": [{"name": "input_ids", "shape": [1, seq], "dtype": "int64"}],
        "params": params, "trainableParams": params, "frozenParams": 0, "packedParams": 0,
        "paramBytes": params * fp32, "buffers": 0, "bufferBytes": 0, "unusedParams": 0,
        "flops": layer_flops + functional, "layerFlops": layer_flops, "functionalFlops": functional,
        "uncountedOps": [], "activationBytes": activation, "syntheticConnections": [],
    }
    return doc


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="DIR", required=True, help="folder to write the .neurarch.json files to")
    args = parser.parse_args(argv)
    for name, doc in (("resnet50", resnet50_graph()), ("llama7b", llama7b_graph())):
        path = os.path.join(args.write, f"{name}.neurarch.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, separators=(",", ":"))
            handle.write("\n")
        print(f"wrote {path} ({os.path.getsize(path):,} bytes, {len(doc['components'])} components)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
