import { describe, expect, it } from "vitest";
import { normalize } from "../src/graph.js";
import { layerRows, paramsNote, totals } from "../src/rows.js";
import { graph, traced } from "./fixtures.js";

describe("layer rows", () => {
  it("says shared only when the first call owns parameters", () => {
    const model = normalize(graph([
      ["x", "input", ""], ["fc", "linear", "", 42], ["act", "relu", "", 0],
      ["fc2", "linear", "", 0, { measured: { sharedWith: "fc" } }], ["act2", "relu", "", 0, { measured: { sharedWith: "act" } }],
      ["out", "output", ""]]));
    const notes = layerRows(model).map((r) => [r.id, r.params, r.note]);
    expect(notes).toEqual([["fc", 42, null], ["act", 0, null], ["fc2", 0, "shared with fc"], ["act2", 0, null]]);
  });

  it("names the embedding a tied head shares its weight with", () => {
    const model = normalize(graph([
      ["x", "input", ""], ["wpe", "embedding", "", 64 * 8, { params: { vocabSize: 64, embeddingDim: 8 } }],
      ["wte", "embedding", "", 50 * 8, { params: { vocabSize: 50, embeddingDim: 8 } }],
      ["head", "lmHead", "", 0, { name: "lm_head", params: { embedDim: 8, vocabSize: 50, bias: false, weightTied: true } }],
      ["out", "output", ""]]));
    const head = model.nodes.find((n) => n.id === "head");
    expect(paramsNote(model, head)).toBe("tied to wte");
  });

  it("lists every operand of a merge", () => {
    const model = normalize(graph([["x", "input", ""], ["a", "linear", ""], ["cat", "concatenate", "", 0,
      { inputShape: [4], outputShape: [10], measured: { inputShapes: [[4], [6]] } }], ["out", "output", ""]]));
    expect(layerRows(model).map((r) => r.inputShapes)).toEqual([[[4]], [[4], [6]]]);
  });

  it("ResNet-18: ReLUs called twice get no note, FLOPs per sample, totals split", () => {
    const model = normalize(traced("traced_resnet18"));
    const rows = layerRows(model);
    expect(rows.length).toBe(68);
    const second = rows.find((r) => r.name === "layer1.0.relu#2");
    expect(second.note).toBe(null);
    const conv1 = rows.find((r) => r.name === "conv1");
    // Traced at batch 2 on 3x64x64: conv 7x7, 3 -> 64, 64x32x32 outputs x 3*49 MACs x 2 = 19,267,584 per sample.
    expect(model.batch).toBe(2);
    expect(conv1.flops).toBe(19267584);
    expect(conv1.inputShapes).toEqual([[3, 64, 64]]);
    const t = totals(model, rows);
    expect([t.params, t.trainable, t.frozen, t.layers]).toEqual([11689512, 11689512, 0, 68]);
    expect(t.saved).toBe(null);
  });
});
