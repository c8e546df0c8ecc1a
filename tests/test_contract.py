"""The ``.neurarch.json`` contract package: one validator for the writer and the plan's verifier,
one set of limits, one topological order, the vocabulary the tracer's mapping is held to."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, List

import pytest

from neurarch_trace import check_graph, read_graph, validate_graph, write_graph
from neurarch_trace.contract import (
    TYPES,
    VOCABULARY,
    ZERO_COST_TYPES,
    Graph,
    check_type,
    contract_problems,
    default_graph_path,
    index_graph,
    layout,
    levels,
    topological_order,
)
from neurarch_trace.errors import GraphError, NeurarchError
from neurarch_trace.planner import make_plan


def node(id_: str, type_: str, **extra: Any) -> Dict[str, Any]:
    return {"id": id_, "name": id_, "type": type_, "params": {}, **extra}


def doc(comps: List[dict], edges: List[tuple]) -> Dict[str, Any]:
    conns = [{"id": f"e{i}", "from": a, "to": b, "fromPort": "bottom", "toPort": "top"}
             for i, (a, b) in enumerate(edges)]
    return {"id": "g", "name": "g", "description": "", "components": comps, "connections": conns}


def broken() -> Dict[str, Any]:
    """in -> a -> (ghost); b <-> c; an unnamed component with a null params and a null shape."""
    comps = [node("in", "input", outputShape=[3]), node("a", "relu", inputShape=[3]), node("b", "relu"),
             node("c", "relu"), {"id": "d", "type": "relu", "params": None, "outputShape": None}]
    return doc(comps, [("in", "a"), ("a", "ghost"), ("b", "c"), ("c", "b"), ("c", "d")])


def test_one_validator_two_wordings() -> None:
    problems = contract_problems(index_graph(broken()))
    assert [p.code for p in problems] == [
        "dangling-connection", "no-output", "sink-not-output", "sink-not-output", "cycle"]
    # the plan's blockers name layers by name ...
    assert [p.message for p in problems] == [
        "connection e1 points to missing layer 'ghost' (from 'a')",
        "the graph has no output node",
        "'a' has no outgoing connection but is not an output (dead branch)",
        "'d' has no outgoing connection but is not an output (dead branch)",
        "cycle through 'b' -> 'c' -> 'b'",
    ]
    # ... the writer's errors name components by id; strict adds the format's letter
    assert validate_graph(broken()) == [
        "connection 'e1' from 'a' to 'ghost' has an end that does not exist",
        "the graph has no output node",
        "component 'a' (relu) has no outgoing connection but is not an output",
        "component 'd' (relu) has no outgoing connection but is not an output",
        "the connections form a cycle through b, c",
        "component 'd' has no string 'name'",
        "component 'd' has no 'params' object",
        "component 'd' has outputShape None, not a flat list of positive integers",
    ]
    with pytest.raises(GraphError) as info:
        check_graph(broken())
    assert str(info.value) == ("the graph is not a valid .neurarch.json graph: connection 'e1' from 'a' to 'ghost' "
                               "has an end that does not exist (and 7 more)")


def test_the_verifier_reports_what_the_validator_finds() -> None:
    blockers = make_plan(broken())["plan"]["run"]["details"]
    lenient = contract_problems(index_graph(broken()))
    assert [(b["code"], b["layer"], b["message"]) for b in blockers[: len(lenient)]] == [
        (p.code, p.layer, p.message) for p in lenient]


def test_one_set_of_limits_for_writer_and_verifier() -> None:
    comps = [node("in", "input", outputShape=[4]), node("L", "relu", inputShape=[4], outputShape=[1] * 65),
             node("out", "output", inputShape=[4])]
    wide = doc(comps, [("in", "L"), ("L", "out")])
    assert validate_graph(wide) == ["component 'L' has outputShape that has more than 64 dimensions"]
    assert make_plan(wide)["plan"]["run"]["blockers"] == ["'L': outputShape has more than 64 dimensions"]


def test_not_a_graph_is_refused_by_reader_and_indexer(tmp_path: Path) -> None:
    path = tmp_path / "g.neurarch.json"
    path.write_text('{"components": [{"name": "x"}], "connections": []}')
    not_a_graph = r"^graph file .* is not a \.neurarch\.json graph: component #0 has no string 'id'$"
    with pytest.raises(GraphError, match=not_a_graph):
        read_graph(path)
    with pytest.raises(GraphError, match="^base is not a graph: component 0 has no string 'id'$"):
        index_graph(json.loads(path.read_text()), what="base")
    assert isinstance(Graph.from_doc(doc([node("in", "input")], [])), Graph)


def test_write_then_read_strict_round_trip(tmp_path: Path) -> None:
    clean = doc([node("in", "input", outputShape=[2]), node("r", "relu", inputShape=[2], outputShape=[2]),
                 node("out", "output", inputShape=[2])], [("in", "r"), ("r", "out")])
    path = write_graph(clean, tmp_path / "c.neurarch.json")
    assert read_graph(path, strict=True) == clean
    assert validate_graph(clean) == []


def test_a_device_or_a_pipe_is_written_into_not_replaced(tmp_path: Path) -> None:
    import os
    import stat
    import threading

    clean = doc([node("in", "input", outputShape=[2]), node("out", "output", inputShape=[2])], [("in", "out")])
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    got: List[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert write_graph(clean, fifo) == str(fifo)
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the pipe, not a file renamed over it
    assert json.loads(got[0]) == clean
    write_graph(clean, "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    if os.path.exists("/dev/full"):  # a device that refuses the bytes: the error names it
        with pytest.raises(OSError, match=r"^\[Errno 28\] cannot write /dev/full: No space left on device"):
            write_graph(clean, "/dev/full")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def _respects(order: tuple, edges: List[tuple]) -> bool:
    position = {n: i for i, n in enumerate(order)}
    return all(position[a] < position[b] for a, b in edges)


def test_topological_order_and_what_a_cycle_blocks() -> None:
    rng = random.Random(0)
    nodes = list(range(200))
    edges = [(a, b) for a in nodes for b in nodes if a < b and rng.random() < 0.03]
    rng.shuffle(nodes)
    preds: Dict[int, List[int]] = {n: [] for n in nodes}
    for a, b in edges:
        preds[b].append(a)
    result = topological_order(nodes, preds)
    assert result.stuck == frozenset() and sorted(result.order) == sorted(nodes)
    assert _respects(result.order, edges)
    # a back edge 150 -> 10 puts 10..150 on a cycle and everything downstream behind it
    preds[10].append(150)
    blocked = topological_order(nodes, preds)
    reach = {10}
    for a, b in sorted(edges):
        if a in reach:
            reach.add(b)
    assert blocked.stuck == frozenset(reach | {10})
    assert _respects(blocked.order, [(a, b) for a, b in edges if b not in blocked.stuck])


def test_levels_are_longest_paths_and_layout_rows() -> None:
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("a", "e")]
    assert levels("abcde", edges) == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 1}
    assert layout(list("abcde"), edges) == {
        "a": {"x": 0, "y": 0}, "b": {"x": 0, "y": 100}, "c": {"x": 0, "y": 200},
        "d": {"x": 0, "y": 300}, "e": {"x": 240, "y": 100}}


def test_vocabulary() -> None:
    assert TYPES["linear"] == ("inFeatures", "outFeatures", "bias")
    assert TYPES["groupedQueryAttention"] == ("embedDim", "numHeads", "numKVHeads")
    assert {"add", "concatenate", "stack", "input", "output", "rope"} <= ZERO_COST_TYPES <= VOCABULARY
    assert check_type("lmHead") == "lmHead"
    with pytest.raises(ValueError, match="'Linear' is not a type"):
        check_type("Linear")


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized modules warn that quantization is deprecated
def test_every_type_the_mapping_can_emit_is_in_the_vocabulary() -> None:
    pytest.importorskip("torch")
    from neurarch_trace import mapping

    for cls, spec in mapping._TORCH_TABLE.items():  # every torch.nn class the table knows, built small
        kind, _ = spec(cls(*_args_for(cls)))
        assert kind in VOCABULARY, (cls, kind)


def _args_for(cls: type) -> tuple:
    import torch.nn as nn

    name = cls.__name__
    if "Conv" in name:
        return (4, 4, 3)
    if name in ("Linear",):
        return (4, 4)
    if "Pool" in name and "Adaptive" in name:
        return (1,)
    if "Pool" in name:
        return (2,)
    if "Embedding" in name:
        return (10, 4)
    if name in ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"):
        return (4, 4)
    if name in ("PixelShuffle", "PixelUnshuffle"):
        return (2,)
    if name == "MultiheadAttention":
        return (4, 2)
    if "BatchNorm" in name or "InstanceNorm" in name:
        return (4,)
    if name == "GroupNorm":
        return (2, 4)
    if name in ("LayerNorm", "RMSNorm"):
        return (4,)
    assert issubclass(cls, nn.Module)
    return ()


def test_default_graph_path() -> None:
    assert default_graph_path("ResNet18") == "ResNet18.neurarch.json"
    assert default_graph_path("a/b c") == "a_b_c.neurarch.json"
    assert default_graph_path("...") == "model.neurarch.json"


def test_output_path_checks(tmp_path: Path) -> None:
    from neurarch_trace.contract import check_output_path

    assert check_output_path(str(tmp_path / "g.neurarch.json")) == str(tmp_path / "g.neurarch.json")
    with pytest.raises(NeurarchError, match="folder .* does not exist$"):
        check_output_path(str(tmp_path / "nowhere" / "g.neurarch.json"))
    with pytest.raises(NeurarchError, match="it is a folder; give a file name ending in .neurarch.json$"):
        check_output_path(str(tmp_path))


def test_the_public_graph_module_is_the_contract() -> None:
    import neurarch_trace
    import neurarch_trace.contract as contract
    import neurarch_trace.graph as graph

    for name in graph.__all__:
        assert getattr(graph, name) is getattr(contract, name), name
    for name in ("read_graph", "write_graph", "validate_graph", "check_graph"):
        assert getattr(neurarch_trace, name) is getattr(contract, name), name


def test_a_replaced_graph_keeps_its_mode_and_a_new_one_gets_opens(tmp_path: Path) -> None:
    import os
    import stat

    clean = doc([node("in", "input", outputShape=[2]), node("out", "output", inputShape=[2])], [("in", "out")])
    umask = os.umask(0o027)  # a stricter umask than the usual 022: a new file follows it, as open() does
    try:
        fresh = write_graph(clean, tmp_path / "new.neurarch.json")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o640
    for mode in (0o600, 0o444, 0o664):  # made private, read-only, group-writable: each stays so
        path = tmp_path / f"{mode:o}.neurarch.json"
        path.write_text("{}")
        path.chmod(mode)
        write_graph(clean, path)
        assert stat.S_IMODE(path.stat().st_mode) == mode
        assert json.loads(path.read_text()) == clean
    assert sorted(p.name for p in tmp_path.iterdir()) == ["444.neurarch.json", "600.neurarch.json",
                                                           "664.neurarch.json", "new.neurarch.json"]


def test_a_graph_written_to_a_gz_path_is_gzip_compressed_and_reads_back(tmp_path: Path) -> None:
    import gzip

    clean = doc([node("in", "input", outputShape=[2]), node("out", "output", inputShape=[2])], [("in", "out")])
    plain = Path(write_graph(clean, tmp_path / "g.neurarch.json"))
    packed = Path(write_graph(clean, tmp_path / "g.neurarch.json.gz"))
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic bytes, what `gunzip -t` checks
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert read_graph(packed, strict=True) == clean
    first = packed.read_bytes()
    write_graph(clean, packed)
    assert packed.read_bytes() == first  # no timestamp in the header: the same graph, the same bytes


def test_a_gzip_graph_reads_as_the_graph_and_bad_bytes_are_one_sentence(tmp_path: Path) -> None:
    import gzip

    clean = doc([node("in", "input", outputShape=[2]), node("out", "output", inputShape=[2])], [("in", "out")])
    plain = write_graph(clean, tmp_path / "g.neurarch.json")
    packed = tmp_path / "g.neurarch.json.gz"
    packed.write_bytes(gzip.compress(Path(plain).read_bytes()))
    assert read_graph(packed, strict=True) == clean
    damaged = tmp_path / "damaged.neurarch.json.gz"
    damaged.write_bytes(packed.read_bytes()[:20])  # cut short
    with pytest.raises(GraphError, match=r"^graph file .*damaged\.neurarch\.json\.gz is gzip-compressed but cannot "
                                         r"be decompressed \(.*\); compress it again or give the \.neurarch\.json "
                                         r"itself$"):
        read_graph(damaged)
    latin = tmp_path / "latin.neurarch.json"
    latin.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(GraphError) as info:
        read_graph(latin)
    assert str(info.value) == f"graph file {latin} is not UTF-8 text (byte 13 is 0xe9): a .neurarch.json graph is JSON"


def test_a_file_larger_than_any_graph_is_not_read_into_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a new-user pass: `neurarch-trace plan /dev/zero` read 24 GB before the kernel killed it
    import gzip as gzip_module

    import neurarch_trace.contract.files as files

    assert files.MAX_GRAPH_BYTES == 256 * 2 ** 20
    monkeypatch.setattr(files, "MAX_GRAPH_BYTES", 2 ** 20)  # the same checks at 1 MiB, in a fraction of the time
    message = (r"holds more than 1 MiB, more than any \.neurarch\.json graph \(a 10,000-layer graph is 7 MB\): "
               r"give the file the trace wrote")
    if Path("/dev/zero").exists():
        with pytest.raises(GraphError, match="graph file /dev/zero " + message):
            read_graph("/dev/zero")
    big = tmp_path / "big.neurarch.json"
    big.write_bytes(b" " * (2 ** 20 + 1))
    with pytest.raises(GraphError, match=message):
        read_graph(big)
    # a gzip file that decompresses past the limit (3 MiB of spaces in a few KB) is cut short too
    bomb = tmp_path / "bomb.neurarch.json.gz"
    with gzip_module.open(bomb, "wb") as fh:
        fh.write(b" " * 3 * 2 ** 20)
    assert bomb.stat().st_size < 2 ** 16
    with pytest.raises(GraphError, match=message):
        read_graph(bomb)
    big.write_bytes(b" " * 2 ** 20)  # at the limit: read, and refused for what it is
    with pytest.raises(GraphError, match="is not JSON"):
        read_graph(big)
