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
    const peaks = [{ phase: "forward", perSampleBytes: { activations: 2000 } }, { phase: "optimizer", stateBytes: { gradients: 4000 } }];
    const m = normalize(graph([["x", "input", ""]], { measured: { batchSize: 2, training: { peakBytes: 12345678, peakPhase: "backward", stateBytes: { params: 4000, grads: 4000 }, peaks } } }));
    const text = memoryElement(m).textContent;
    expect(text).toContain("peak bytes12.3 MB");
    expect(text).toContain("peak phasebackward");
    expect(text).toContain("state bytesparams 4.0 KB · grads 4.0 KB");
    // the phase peaks item by item (a share page showed "[object Object], [object Object]")
    expect(text).toContain("peaksphase forward · per sample bytes activations 2.0 KB | phase optimizer · state bytes gradients 4.0 KB");
    expect(text).not.toContain("object Object");
    // the batch it was rehearsed at, which the card's own batch may differ from; nothing about sending
    expect(text).toContain("rehearsed by the trace at batch 2 (the card sizes its own batch)");
    expect(text).not.toContain("nothing sent");
    // an empty object or list (no attention kernels, no per-layer bytes) is no row
    const bare = normalize(graph([["x", "input", ""]], { measured: { training: { peakPhase: "forward", attention: {}, savedBytes: [] } } }));
    expect(memoryElement(bare).textContent).not.toMatch(/attention|saved bytes/);
  });
});
