"""An independent reader of the .neurarch.json contract (shared/spec/neurarch-graph.md).

Written apart from neurarch_trace.graph on purpose: the tests check the tracer's output with code
that shares nothing with it.
"""

from __future__ import annotations

import json
from collections import Counter

KEYS = {
    "linear": {"inFeatures", "outFeatures"},
    "conv1d": {"inChannels", "outChannels", "kernelSize", "stride", "padding"},
    "conv2d": {"inChannels", "outChannels", "kernelSize", "stride", "padding"},
    "conv3d": {"inChannels", "outChannels", "kernelSize", "stride", "padding"},
    "transposeConv2d": {"inChannels", "outChannels", "kernelSize", "stride", "padding", "outputPadding"},
    "depthwiseConv2d": {"inChannels", "kernelSize", "depthMultiplier"},
    "patchEmbed": {"patchSize", "embedDim", "inChans"},
    "maxpool2d": {"kernelSize", "stride"},
    "avgpool2d": {"kernelSize", "stride"},
    "embedding": {"vocabSize", "embeddingDim"},
    "lstm": {"inputSize", "hiddenSize", "numLayers"},
    "gru": {"inputSize", "hiddenSize", "numLayers"},
    "rnn": {"inputSize", "hiddenSize", "numLayers"},
    "multiHeadAttention": {"hiddenDim", "numHeads"},
    "lmHead": {"embedDim", "vocabSize", "bias", "weightTied"},
    "batchNorm": {"numFeatures"},
    "layerNorm": {"normalizedShape"},
    "rmsNorm": {"normalizedShape"},
    "groupNorm": {"numGroups", "numChannels"},
    "dropout": {"p"},
    "customModule": {"className", "paramCount"},
    "input": {"shape"},
}


def assert_clean(graph: dict) -> None:
    """Assert every rule of a clean graph; raise AssertionError naming the first broken one."""
    json.loads(json.dumps(graph))  # JSON-serialisable, no NaN
    assert isinstance(graph, dict)
    for field in ("id", "name", "description", "components", "connections"):
        assert field in graph, f"missing top-level {field}"
    comps = graph["components"]
    ids = [c["id"] for c in comps]
    names = [c["name"] for c in comps]
    assert all(isinstance(i, str) for i in ids)
    dup_ids = [i for i, n in Counter(ids).items() if n > 1]
    dup_names = [i for i, n in Counter(names).items() if n > 1]
    assert not dup_ids, f"duplicate ids {dup_ids}"
    assert not dup_names, f"duplicate names {dup_names}"
    by_id = {c["id"]: c for c in comps}
    succ = {i: [] for i in ids}
    pred = {i: [] for i in ids}
    conn_ids = [e["id"] for e in graph["connections"]]
    assert len(set(conn_ids)) == len(conn_ids), "duplicate connection ids"
    for e in graph["connections"]:
        assert e["from"] in by_id and e["to"] in by_id, f"dangling connection {e}"
        assert e["fromPort"] == "bottom" and e["toPort"] == "top"
        succ[e["from"]].append(e["to"])
        pred[e["to"]].append(e["from"])
    for c in comps:
        assert isinstance(c["params"], dict), c
        assert c["inputs"] == pred[c["id"]], f"{c['name']}: inputs do not mirror connections"
        assert c["outputs"] == succ[c["id"]], f"{c['name']}: outputs do not mirror connections"
        assert set(c["position"]) == {"x", "y"}
        for field in ("inputShape", "outputShape"):
            if field in c:
                shape = c[field]
                assert isinstance(shape, list) and shape, f"{c['name']} {field} {shape}"
                assert all(type(d) is int and d > 0 for d in shape), f"{c['name']} {field} {shape}"
        if not pred[c["id"]]:
            assert c["type"] == "input", f"source {c['name']} is a {c['type']}"
        if not succ[c["id"]]:
            assert c["type"] == "output", f"sink {c['name']} is a {c['type']}"
        if "scope" in c:
            assert isinstance(c["scope"], str) and c["scope"]
        need = KEYS.get(c["type"])
        if need:
            assert need <= set(c["params"]), f"{c['name']} ({c['type']}) lacks {need - set(c['params'])}"
    assert sum(1 for c in comps if c["type"] == "output") == 1
    # acyclic: depth-first search with colours
    state = dict.fromkeys(ids, 0)
    for root in ids:
        if state[root]:
            continue
        stack = [(root, iter(succ[root]))]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state[nxt] == 1:
                raise AssertionError(f"cycle through {nxt}")
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))


def by_name(graph: dict) -> dict:
    return {c["name"]: c for c in graph["components"]}


def sources_of(graph: dict, name: str) -> list[str]:
    """Names of the components feeding ``name``, in connection order."""
    comps = {c["id"]: c for c in graph["components"]}
    target = by_name(graph)[name]
    return [comps[i]["name"] for i in target["inputs"]]


def types(graph: dict) -> Counter:
    return Counter(c["type"] for c in graph["components"])
