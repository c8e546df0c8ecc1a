import { describe, expect, it } from "vitest";
import { normalize } from "../src/graph.js";
import { memoryElement, summaryElement } from "../src/summary.js";
import { graph, traced } from "./fixtures.js";

describe("the summary and the measured memory", () => {
  it("writes the summary as the Python fallback does", () => {
    const el = summaryElement(normalize(traced("traced_resnet18")));
    // The same facts as neurarch_trace/notebook/render.py's summary ("ResNet: 68 layers, 11.7M params, ...").
    expect(el.textContent).toMatch(/^ResNet · 68 layers · 11\.7M params · 594\.2 MFLOPs at batch 2/);
    expect(el.textContent).toContain("Input x 2x3x64x64 float32");
  });

  it("shows measured.training when the graph has it, and nothing otherwise", () => {
    expect(memoryElement(normalize(graph([["x", "input", ""]])))).toBe(null);
    const m = normalize(graph([["x", "input", ""]], { measured: { training: { peakBytes: 12345678, peakPhase: "backward", stateBytes: { params: 4000, grads: 4000 } } } }));
    const text = memoryElement(m).textContent;
    expect(text).toContain("peak bytes12.3 MB");
    expect(text).toContain("peak phasebackward");
    expect(text).toContain("state bytesparams 4.0 KB · grads 4.0 KB");
    expect(text).toContain("nothing sent");
  });
});
