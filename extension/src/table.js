// The layer table: sortable by any column, searchable by name or type, filtered by block, with a
// totals row (parameters split trainable/frozen) and, when the graph has them, bytes saved for
// backward. Rows past ROW_PAGE are drawn on request, so a 10,000-layer table stays quick.

import { h } from "./dom.js";
import { bytes, count, exact, flops, shapeText } from "./format.js";
import { hasSaved, layerRows, totals } from "./rows.js";

export const ROW_PAGE = 200;

const numel = (shape) => (Array.isArray(shape) ? shape.reduce((a, b) => a * b, 1) : -1);

const COLUMNS = [
  { key: "name", label: "Layer", sort: (r) => r.name },
  { key: "type", label: "Type", sort: (r) => r.type },
  { key: "input", label: "Input", sort: (r) => numel(r.inputShapes[0]) },
  { key: "output", label: "Output", sort: (r) => numel(r.outputShape) },
  { key: "params", label: "Parameters", num: true, sort: (r) => r.params ?? -1 },
  { key: "flops", label: "FLOPs / sample", num: true, sort: (r) => r.flops ?? -1 },
  { key: "saved", label: "Saved for backward / sample", num: true, sort: (r) => r.saved ?? -1, optional: true },
];

function cell(row, key) {
  switch (key) {
    case "name": return h("td", { class: "nt-name" }, h("code", { text: row.name }));
    case "type": return h("td", { text: row.type });
    case "input": return h("td", { class: "nt-shape", text: row.inputShapes.map(shapeText).join(", ") || "-" });
    case "output": return h("td", { class: "nt-shape", text: shapeText(row.outputShape) });
    case "params": return h("td", { class: "nt-num" }, exact(row.params),
      row.note ? h("span", { class: "nt-param-note", text: ` ${row.note}` }) : null);
    case "flops": return h("td", { class: "nt-num", text: row.flops === null ? "not counted" : flops(row.flops) });
    case "saved": return h("td", { class: "nt-num", text: row.saved === null ? "-" : bytes(row.saved) });
    default: return h("td");
  }
}

/** The block filter's choices: every scope prefix, in graph order, indented by depth. */
function scopeOptions(model) {
  const options = [h("option", { value: "", text: "all blocks" })];
  if (model.nodes.some((n) => !n.scope && n.type !== "input" && n.type !== "output")) options.push(h("option", { value: "\u0000", text: "(top level)" }));
  const visit = (group) => {
    for (const child of group.children) {
      if (!child.group) continue;
      if (!child.group.synthetic) {
        const depth = child.group.key.split(".").length - 1;
        options.push(h("option", { value: child.group.key, text: `${"  ".repeat(depth)}${child.group.key} (${child.group.leaves})` }));
      }
      visit(child.group);
    }
  };
  visit(model.root);
  return options;
}

export function inScope(row, scope) {
  if (!scope) return true;
  if (scope === "\u0000") return !row.scope;
  return row.scope === scope || row.scope.startsWith(`${scope}.`);
}

export function matches(row, query) {
  if (!query) return true;
  const q = query.toLowerCase();
  return row.name.toLowerCase().includes(q) || row.type.toLowerCase().includes(q);
}

export function createTable(model, { onSelect } = {}) {
  const rows = layerRows(model);
  const all = totals(model, rows);
  const columns = COLUMNS.filter((c) => !c.optional || hasSaved(rows));
  const state = { sort: null, dir: 1, query: "", scope: "", limit: ROW_PAGE };

  const search = h("input", { type: "search", class: "nt-search", placeholder: "search layers by name or type", "aria-label": "Search layers" });
  const scope = h("select", { class: "nt-scope", "aria-label": "Filter by block" }, ...scopeOptions(model));
  const shown = h("span", { class: "nt-shown" });
  const head = h("tr", {}, ...columns.map((c) => h("th", { class: c.num ? "nt-num" : "", "data-key": c.key, title: "Sort", text: c.label })));
  const body = h("tbody");
  const foot = h("tfoot");
  const more = h("button", { type: "button", class: "nt-btn nt-more-rows", hidden: true });
  const table = h("table", { class: "nt-table neurarch-layers" }, h("thead", {}, head), body, foot);
  const el = h("div", { class: "nt-layers" },
    h("div", { class: "nt-table-tools" }, search, scope, shown),
    h("div", { class: "nt-table-scroll" }, table), more);

  function visibleRows() {
    const found = rows.filter((r) => inScope(r, state.scope) && matches(r, state.query));
    if (state.sort) {
      const col = columns.find((c) => c.key === state.sort);
      found.sort((a, b) => {
        const x = col.sort(a);
        const y = col.sort(b);
        return (x < y ? -1 : x > y ? 1 : 0) * state.dir || a.index - b.index;
      });
    }
    return found;
  }

  function totalsRow(label, t, cls) {
    const cells = columns.map((c) => {
      switch (c.key) {
        case "name": return h("td", { colspan: 1 }, h("b", { text: label }));
        case "params": {
          const split = t.trainable !== null && t.trainable !== undefined && t.frozen !== null && t.frozen !== undefined
            ? ` (trainable ${count(t.trainable)}, frozen ${count(t.frozen)})` : "";
          return h("td", { class: "nt-num", text: `${exact(t.params)}${split}` });
        }
        case "flops": return h("td", { class: "nt-num", text: flops(t.flops) });
        case "saved": return h("td", { class: "nt-num", text: t.saved === null ? "-" : bytes(t.saved) });
        default: return h("td");
      }
    });
    return h("tr", { class: cls }, ...cells);
  }

  function render() {
    const found = visibleRows();
    body.replaceChildren(...found.slice(0, state.limit).map((row) => {
      const tr = h("tr", { "data-node-id": row.id, title: "Show in the picture" }, ...columns.map((c) => cell(row, c.key)));
      tr.addEventListener("click", () => onSelect && onSelect(row.index));
      return tr;
    }));
    const filtered = found.length !== rows.length;
    const sub = {
      params: found.reduce((a, r) => a + (r.params || 0), 0), trainable: null, frozen: null,
      flops: found.reduce((a, r) => a + (r.flops || 0), 0), saved: all.saved === null ? null : found.reduce((a, r) => a + (r.saved || 0), 0),
    };
    foot.replaceChildren(...[filtered ? totalsRow(`Shown (${found.length} of ${rows.length})`, sub, "nt-subtotal") : null,
      totalsRow(`Total (${rows.length} layers)`, all, "nt-total")].filter(Boolean));
    shown.textContent = filtered ? `${found.length} of ${rows.length} layers` : `${rows.length} layers`;
    const left = found.length - Math.min(found.length, state.limit);
    more.hidden = left <= 0;
    more.textContent = left > 0 ? `Show ${Math.min(left, ROW_PAGE)} more (${left} not shown)` : "";
    for (const th of head.children) {
      const key = th.getAttribute("data-key");
      th.setAttribute("aria-sort", key === state.sort ? (state.dir > 0 ? "ascending" : "descending") : "none");
    }
  }

  head.addEventListener("click", (event) => {
    const th = event.target.closest("th");
    if (!th) return;
    const key = th.getAttribute("data-key");
    if (state.sort === key) state.dir = -state.dir;
    else {
      state.sort = key;
      state.dir = columns.find((c) => c.key === key).num ? -1 : 1; // numbers: largest first
    }
    render();
  });
  search.addEventListener("input", () => { state.query = search.value.trim(); state.limit = ROW_PAGE; render(); });
  scope.addEventListener("change", () => { state.scope = scope.value; state.limit = ROW_PAGE; render(); });
  more.addEventListener("click", () => { state.limit += ROW_PAGE; render(); });
  render();
  return { el, state, render, rows, totals: all };
}
