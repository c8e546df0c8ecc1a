import { describe, expect, it } from "vitest";
import { normalize } from "../src/graph.js";
import { ROW_PAGE, createTable } from "../src/table.js";
import { flatChain, graph, traced } from "./fixtures.js";

const names = (t) => [...t.el.querySelectorAll("tbody tr")].map((tr) => tr.querySelector("code").textContent);
const header = (t, label) => [...t.el.querySelectorAll("th")].find((th) => th.textContent === label);

describe("the layer table", () => {
  const model = normalize(traced("traced_resnet18"));

  it("has a row per layer and a totals row split trainable/frozen", () => {
    const t = createTable(model);
    expect(names(t).length).toBe(68);
    const total = t.el.querySelector("tfoot .nt-total").textContent;
    expect(total).toContain("Total (68 layers)");
    expect(total).toContain("11,689,512 (trainable 11.7M, frozen 0)");
    expect(t.el.querySelector("thead").textContent).not.toContain("Saved");
  });

  it("sorts by parameters, largest first, then back", () => {
    const t = createTable(model);
    header(t, "Parameters").click();
    expect(names(t)[0]).toBe("layer4.0.conv2"); // 512*512*9 = 2,359,296: the first of the largest
    header(t, "Parameters").click();
    expect(names(t)[names(t).length - 1]).toBe("layer4.1.conv2");
  });

  it("searches and filters by block, with a subtotal", () => {
    const t = createTable(model);
    const search = t.el.querySelector(".nt-search");
    search.value = "downsample";
    search.dispatchEvent(new Event("input"));
    expect(names(t)).toEqual(["layer2.0.downsample.0", "layer2.0.downsample.1", "layer3.0.downsample.0",
      "layer3.0.downsample.1", "layer4.0.downsample.0", "layer4.0.downsample.1"]);
    expect(t.el.querySelector(".nt-subtotal").textContent).toContain("Shown (6 of 68)");
    search.value = "";
    search.dispatchEvent(new Event("input"));
    const scope = t.el.querySelector(".nt-scope");
    scope.value = "layer1";
    scope.dispatchEvent(new Event("change"));
    expect(names(t).every((n) => n.startsWith("layer1."))).toBe(true);
    expect(names(t).length).toBe(14);
    // 2 blocks x (2 convs of 64*64*9 + 2 batch norms of 2*64) = 147,968 parameters.
    expect(t.el.querySelector(".nt-subtotal").textContent).toContain("147,968");
  });

  it("calls onSelect with the node index when a row is clicked", () => {
    const picked = [];
    const t = createTable(model, { onSelect: (i) => picked.push(i) });
    t.el.querySelector('tbody tr[data-node-id="n1"]').click();
    expect(picked).toEqual([1]);
  });

  it("shows saved bytes for backward when the graph has them", () => {
    const m = normalize(graph([["x", "input", ""], ["a", "linear", "", 72, { measured: { savedBytes: 4096 } }], ["out", "output", ""]], { measured: { batchSize: 2 } }));
    const t = createTable(m);
    expect(t.el.querySelector("thead").textContent).toContain("Saved for backward / sample");
    expect(t.el.querySelector("tbody").textContent).toContain("2.0 KB");
  });

  it("pages long tables", () => {
    const t = createTable(normalize(flatChain(1000)));
    expect(names(t).length).toBe(ROW_PAGE);
    const more = t.el.querySelector(".nt-more-rows");
    expect(more.hidden).toBe(false);
    more.click();
    expect(names(t).length).toBe(2 * ROW_PAGE);
  });
});
