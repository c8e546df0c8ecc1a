import { describe, expect, it } from "vitest";
import { normalize } from "../src/graph.js";
import { MAX_BOXES, createPicture } from "../src/picture.js";
import { flatChain, traced } from "./fixtures.js";

const ids = (el) => [...el.querySelectorAll("[data-node-id]")].map((n) => n.getAttribute("data-node-id"));
const click = (el) => el.dispatchEvent(new MouseEvent("click", { bubbles: true }));
const button = (el, cls) => el.querySelector(`.${cls}`);

describe("the picture of ResNet-18", () => {
  const model = normalize(traced("traced_resnet18"));

  it("starts at the depth that fits and draws one element per node when all is open", () => {
    const pic = createPicture(model);
    document.body.append(pic.el);
    expect(pic.el.dataset.boxes).toBe("16");
    expect(pic.el.querySelectorAll(".nt-group").length).toBe(8); // layer1.0 ... layer4.1, closed
    click(button(pic.el, "nt-open-all"));
    const drawn = ids(pic.el);
    expect(drawn.length).toBe(model.nodes.length);
    expect(new Set(drawn)).toEqual(new Set(model.nodes.map((n) => n.id)));
    expect(pic.el.querySelectorAll(".nt-edge-residual").length).toBe(16);
    expect(pic.el.querySelectorAll(".nt-cluster").length).toBe(15);
    click(button(pic.el, "nt-close-all"));
    expect(pic.el.dataset.boxes).toBe("12");
    pic.el.remove();
  });

  it("opens a block on click and closes it from its label", () => {
    const pic = createPicture(model);
    const block = pic.el.querySelector('[data-scope="layer2.0"]');
    click(block.querySelector("rect"));
    expect(ids(pic.el)).toContain("n23");
    expect(pic.el.querySelector('.nt-cluster[data-scope="layer2.0"]')).toBeTruthy();
    click(pic.el.querySelector('.nt-cluster[data-scope="layer2.0"] .nt-cluster-label'));
    expect(pic.el.querySelector('.nt-cluster[data-scope="layer2.0"]')).toBe(null);
    expect(pic.el.querySelector('.nt-group[data-scope="layer2.0"]')).toBeTruthy();
  });

  it("hover shows the facts, a click pins them", () => {
    const pic = createPicture(model);
    const conv = pic.el.querySelector('[data-node-id="n1"] rect');
    conv.dispatchEvent(new MouseEvent("mousemove", { bubbles: true, clientX: 5, clientY: 5 }));
    const tip = pic.el.querySelector(".nt-tip");
    expect(tip.hidden).toBe(false);
    const text = tip.textContent;
    for (const part of ["conv1", "conv2d", "3x64x64", "64x32x32", "9,408", "19.3 MFLOPs per sample", "kernelSize=7"]) expect(text).toContain(part);
    click(conv);
    expect(pic.el.querySelector(".nt-panel").textContent).toContain("9,408");
    expect(pic.el.querySelector('[data-node-id="n1"]').classList.contains("nt-pinned")).toBe(true);
  });

  it("reveal opens the blocks around a layer and pins it", () => {
    const pic = createPicture(model);
    const index = model.nodes.findIndex((n) => n.name === "layer4.1.conv2");
    pic.reveal(index);
    expect(ids(pic.el)).toContain(model.nodes[index].id);
    expect(pic.el.querySelector(".nt-panel").textContent).toContain("layer4.1.conv2");
  });
});

describe("a 4,000-layer stack", () => {
  it("draws a screenful, and never more than MAX_BOXES", () => {
    const model = normalize(flatChain(4000));
    const pic = createPicture(model);
    expect(Number(pic.el.dataset.boxes)).toBeLessThanOrEqual(42);
    click(button(pic.el, "nt-open-all"));
    expect(Number(pic.el.dataset.boxes)).toBeLessThanOrEqual(MAX_BOXES);
    expect(pic.el.querySelector(".nt-note").textContent).toMatch(/boxes/);
  });
});
