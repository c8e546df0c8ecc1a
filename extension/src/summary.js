// The one-line summary (name, layers, parameters, FLOPs at the traced batch, inputs and output) and
// the training memory the trace measured, both read from the graph alone: nothing is sent for them.

import { h } from "./dom.js";
import { bytes, count, flops, plural, shapeText } from "./format.js";
import { isLayer } from "./graph.js";

export function summaryElement(model) {
  const m = model.measured;
  const layers = model.nodes.filter(isLayer).length;
  const facts = [plural(layers, "layer"), `${count(m.params)} params`];
  if (typeof m.flops === "number") facts.push(`${flops(m.flops)}${typeof m.batchSize === "number" ? ` at batch ${m.batchSize}` : ""}`);
  const shapes = [];
  for (const input of Array.isArray(m.inputs) ? m.inputs : []) {
    shapes.push(h("span", {}, "Input ", h("code", { text: input.name }), ` ${shapeText(input.shape)} ${input.dtype || ""}`.trimEnd()));
  }
  const out = model.nodes.find((n) => n.type === "output");
  if (out && out.inputShape) shapes.push(h("span", { text: `Output ${shapeText(out.inputShape)} per sample` }));
  const joined = [];
  shapes.forEach((el, i) => { if (i) joined.push(" · "); joined.push(el); });
  const uncounted = Array.isArray(m.uncountedOps) ? m.uncountedOps : [];
  return h("div", { class: "nt-summary" },
    h("div", {}, h("b", { class: "neurarch-name", text: model.name }), ` · ${facts.join(" · ")}`),
    joined.length ? h("div", { class: "nt-muted" }, ...joined) : null,
    uncounted.length ? h("div", { class: "nt-muted", text: `FLOPs leave out ${uncounted.slice(0, 5).join(", ")}${uncounted.length > 5 ? " and more" : ""} (no formula)` }) : null);
}

const words = (key) => key.replace(/([a-z0-9])([A-Z])/g, "$1 $2").toLowerCase();

/** A value as text; numbers under a key ending in "Bytes" (or nested in one) are bytes, "Flops" FLOPs. */
function valueText(key, value, unit = key) {
  if (typeof value === "number") return /bytes$/i.test(unit) ? bytes(value) : /flops$/i.test(unit) ? flops(value) : count(value);
  // a list of objects (the phase peaks) item by item, as the objects themselves
  if (Array.isArray(value)) return value.map((v) => valueText(key, v, unit)).join(value.some((v) => v && typeof v === "object") ? " | " : ", ");
  if (value && typeof value === "object") {
    return Object.entries(value).map(([k, v]) => `${words(k)} ${valueText(k, v, /(bytes|flops)$/i.test(k) ? k : unit)}`).join(" · ");
  }
  return String(value);
}

/** The training memory the trace measured (`measured.training`, written by the trace's training-step
 *  rehearsal), as label/value rows; null when the graph has none. */
export function memoryElement(model) {
  const training = model.measured.training;
  if (!training || typeof training !== "object") return null;
  const empty = (v) => v === null || v === undefined || (typeof v === "object" && Object.keys(v).length === 0);
  const rows = Object.entries(training).filter(([, v]) => !empty(v));
  if (!rows.length) return null;
  return h("div", { class: "nt-memory" },
    h("div", { class: "nt-memory-title" }, h("b", { text: "Training memory" }), h("span", { class: "nt-muted", text: ` rehearsed by the trace at batch ${typeof model.measured.batchSize === "number" ? model.measured.batchSize : "?"} (the card sizes its own batch)` })),
    h("dl", {}, ...rows.flatMap(([k, v]) => [h("dt", { text: words(k) }), h("dd", { text: valueText(k, v) })])));
}
