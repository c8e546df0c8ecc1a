// What a box is: the facts the hover card and the pinned panel show for a layer or a block.

import { h } from "./dom.js";
import { bytes, count, exact, flops, shapeText } from "./format.js";
import { inputShapes, paramsNote } from "./rows.js";

const num = (v) => typeof v === "number" && Number.isFinite(v);

function hyper(params) {
  return Object.entries(params || {})
    .filter(([, v]) => v !== null && typeof v !== "object")
    .map(([k, v]) => `${k}=${v}`)
    .join("\n");
}

/** [[label, value], ...] for one layer node. */
export function layerFacts(model, node) {
  const m = node.measured;
  const per = model.batch;
  const facts = [["type", node.type]];
  if (node.scope) facts.push(["scope", node.scope]);
  if (node.type === "input") {
    facts.push(["shape", shapeText(node.outputShape)]);
    if (m.dtype) facts.push(["dtype", m.dtype]);
    return facts;
  }
  if (node.type === "output") {
    facts.push(["shape", shapeText(node.inputShape)]);
    return facts;
  }
  const ins = inputShapes(node).map(shapeText).join(", ");
  facts.push(["input", ins || "-"], ["output", shapeText(node.outputShape)]);
  const note = paramsNote(model, node);
  facts.push(["parameters", `${exact(m.params)}${note ? ` (${note})` : ""}`]);
  facts.push(["FLOPs", num(m.flops) ? `${flops(m.flops / per)} per sample` : m.flops === null ? "not counted" : "?"]);
  if (num(m.savedBytes)) facts.push(["saved for backward", `${bytes(m.savedBytes / per)} per sample`]);
  if (Array.isArray(m.uncounted) && m.uncounted.length) facts.push(["uncounted", m.uncounted.join(", ")]);
  const hp = hyper(node.params);
  if (hp) facts.push(["hyperparameters", hp]);
  return facts;
}

/** [[label, value], ...] for a block. */
export function groupFacts(model, group) {
  const facts = [["block", group.key.split("#")[0] || "(top level)"], ["layers", exact(group.leaves)],
    ["parameters", `${exact(group.params)} (${count(group.params)})`],
    ["FLOPs", `${flops(group.flops / model.batch)} per sample`]];
  return facts;
}

/** The facts as a definition list, with the box's name as its title. */
export function factsElement(title, facts) {
  return h("div", { class: "nt-facts" },
    h("div", { class: "nt-facts-title", text: title }),
    h("dl", {}, ...facts.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])));
}

export function unitFacts(model, unit) {
  if (unit.kind === "group") return factsElement(unit.group.label, groupFacts(model, unit.group));
  return factsElement(unit.node.name, layerFacts(model, unit.node));
}
