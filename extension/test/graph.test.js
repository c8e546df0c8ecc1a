import { describe, expect, it } from "vitest";
import { MAX_CHILDREN, countAtLevel, expandedAtLevel, fittingLevel, maxDepth, normalize, reveal, visibleGraph } from "../src/graph.js";
import { flatChain, graph, traced } from "./fixtures.js";

describe("the scope tree of ResNet-18", () => {
  const model = normalize(traced("traced_resnet18"));

  it("nests layers by scope", () => {
    const top = model.root.children.map((c) => (c.group ? c.group.key : model.nodes[c.node].name));
    expect(top).toEqual(["x", "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc", "output"]);
    const layer2 = model.groups.get("layer2");
    expect(layer2.children.map((c) => c.group.key)).toEqual(["layer2.0", "layer2.1"]);
    expect(model.groups.get("layer2.0.downsample").depth).toBe(3);
    // 68 layers, parameters summed from the nodes that own them: torchvision's 11,689,512.
    expect(model.root.leaves).toBe(68);
    expect(model.root.params).toBe(11689512);
    expect(maxDepth(model)).toBe(3);
  });

  it("opens as deep as fits 40 boxes", () => {
    expect([0, 1, 2, 3].map((l) => countAtLevel(model, l))).toEqual([12, 16, 67, 70]);
    expect(fittingLevel(model, 40)).toBe(1);
    const vis = visibleGraph(model, expandedAtLevel(model, 1));
    expect(vis.units.length).toBe(16);
    expect(vis.clusters.map((c) => c.group.key)).toEqual(["layer1", "layer2", "layer3", "layer4"]);
  });

  it("draws every node once fully open, residual edges into the adds", () => {
    const vis = visibleGraph(model, expandedAtLevel(model, 3));
    expect(vis.units.length).toBe(model.nodes.length);
    expect(vis.edges.length).toBe(77); // every connection, none merged
    const residual = vis.edges.filter((e) => e.kind === "residual");
    expect(residual.length).toBe(16); // 8 blocks, two operands each
    for (const e of residual) expect(vis.units[e.to].node.type).toBe("add");
  });

  it("collapsed blocks take their edges", () => {
    const vis = visibleGraph(model, new Set());
    const names = vis.units.map((u) => (u.kind === "group" ? u.group.key : u.node.name));
    const edge = (a, b) => vis.edges.find((e) => names[e.from] === a && names[e.to] === b);
    expect(edge("maxpool", "layer1")).toBeTruthy();
    expect(edge("layer1", "layer2")).toBeTruthy();
    expect(edge("layer4", "avgpool")).toBeTruthy();
    expect(vis.edges.length).toBe(11);
  });

  it("reveals a node by opening its blocks", () => {
    const index = model.nodes.findIndex((n) => n.name === "layer3.0.downsample.0");
    const open = reveal(model, new Set(), index);
    expect([...open].sort()).toEqual(["layer3", "layer3.0", "layer3.0.downsample"]);
    const vis = visibleGraph(model, open);
    expect(vis.units[vis.rep[index]].node.name).toBe("layer3.0.downsample.0");
  });
});

describe("large graphs", () => {
  it("splits a flat stack into runs of at most MAX_CHILDREN", () => {
    const model = normalize(flatChain(4000));
    expect(model.root.children.length).toBeLessThanOrEqual(MAX_CHILDREN);
    const vis = visibleGraph(model, new Set());
    expect(vis.units.length).toBeLessThanOrEqual(MAX_CHILDREN);
    // The runs chain into each other, in order.
    expect(vis.edges.length).toBe(vis.units.length - 1);
    const firstRun = model.root.children.find((c) => c.group).group;
    expect(firstRun.synthetic).toBe(true);
    expect(firstRun.label).toBe("0 … 1599"); // 40 runs of 40 layers each
    expect(model.root.children[0].node).toBe(0); // the input stays outside the runs
    expect(model.root.leaves).toBe(4000);
  });

  it("merges parallel connections and concat inputs", () => {
    const model = normalize(graph([["x", "input", ""], ["a", "linear", "b"], ["c", "linear", "b"], ["cat", "concatenate", ""], ["out", "output", ""]],
      { edges: [["x", "a"], ["x", "c"], ["a", "cat"], ["c", "cat"], ["cat", "out"]] }));
    const closed = visibleGraph(model, new Set());
    const names = closed.units.map((u) => (u.kind === "group" ? u.group.key : u.node.id));
    expect(names).toEqual(["x", "b", "cat", "out"]);
    const intoCat = closed.edges.filter((e) => names[e.to] === "cat");
    expect(intoCat).toEqual([{ from: 1, to: 2, kind: "concat", count: 2 }]);
  });

  it("ignores connections to unknown ids and tolerates a bare document", () => {
    const doc = graph([["x", "input", ""], ["out", "output", ""]]);
    doc.connections.push({ from: "x", to: "nope" });
    expect(normalize(doc).edges).toEqual([[0, 1]]);
    expect(normalize(null).nodes).toEqual([]);
  });
});
