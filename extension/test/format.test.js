import { describe, expect, it } from "vitest";
import { bytes, count, flops, gb, plural, shapeText } from "../src/format.js";

// Expected values are what neurarch_trace/text.py (and render.byte_size) print for the same numbers.
describe("formats match neurarch_trace.text", () => {
  it("counts parameters", () => {
    const cases = [[0, "0"], [812, "812"], [999, "999"], [1000, "1.0K"], [11689512, "11.7M"], [999950, "1.0M"],
      [6.74e9, "6.7B"], [70.55e9, "70.5B"], [1.2e12, "1.2T"]];
    for (const [value, text] of cases) expect(count(value)).toBe(text);
    expect(count(null)).toBe("?");
  });
  it("writes FLOPs, GB and bytes", () => {
    expect([512, 406500, 1.8e9, 3.6e12].map(flops)).toEqual(["512 FLOPs", "406.5 KFLOPs", "1.8 GFLOPs", "3.6 TFLOPs"]);
    expect([5.1e9, 0.05e9, 123e9].map(gb)).toEqual(["5.1 GB", "0.05 GB", "123.0 GB"]);
    expect([512, 1234, 12345678, 3.4e9].map(bytes)).toEqual(["512 B", "1.2 KB", "12.3 MB", "3.4 GB"]);
  });
  it("writes plurals and shapes", () => {
    expect(plural(1, "layer")).toBe("1 layer");
    expect(plural(68, "layer")).toBe("68 layers");
    expect(shapeText([3, 224, 224])).toBe("3x224x224");
    expect(shapeText([])).toBe("scalar");
    expect(shapeText(undefined)).toBe("-");
  });
});
