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

function totalsRow(columns, label, t, cls) {
  const cells = columns.map((c) => {
    switch (c.key) {
      case "name": return h("td", {}, h("b", { text: label }));
      case "params": {
        const split = typeof t.trainable === "number" && typeof t.frozen === "number"
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

const sum = (rows, key) => rows.reduce((a, r) => a + (r[key] || 0), 0);

/** The layer table of one graph: `el` and its state (sort, query, scope, rows drawn). */
export class LayerTable {
  constructor(model, { onSelect } = {}) {
    this.rows = layerRows(model);
    this.totals = totals(model, this.rows);
    this.onSelect = onSelect;
    this.columns = COLUMNS.filter((c) => !c.optional || hasSaved(this.rows));
    this.state = { sort: null, dir: 1, query: "", scope: "", limit: ROW_PAGE };
    this.search = h("input", { type: "search", class: "nt-search", placeholder: "search layers by name or type", "aria-label": "Search layers" });
    this.scope = h("select", { class: "nt-scope", "aria-label": "Filter by block" }, ...scopeOptions(model));
    this.shown = h("span", { class: "nt-shown" });
    this.head = h("tr", {}, ...this.columns.map((c) => h("th", { class: c.num ? "nt-num" : "", "data-key": c.key, title: "Sort", text: c.label })));
    this.body = h("tbody");
    this.foot = h("tfoot");
    this.more = h("button", { type: "button", class: "nt-btn nt-more-rows", hidden: true });
    const table = h("table", { class: "nt-table neurarch-layers" }, h("thead", {}, this.head), this.body, this.foot);
    this.el = h("div", { class: "nt-layers" }, h("div", { class: "nt-table-tools" }, this.search, this.scope, this.shown),
      h("div", { class: "nt-table-scroll" }, table), this.more);
    this.head.addEventListener("click", (event) => this.sortBy(event.target.closest("th")));
    this.search.addEventListener("input", () => this.filter({ query: this.search.value.trim() }));
    this.scope.addEventListener("change", () => this.filter({ scope: this.scope.value }));
    this.more.addEventListener("click", () => { this.state.limit += ROW_PAGE; this.render(); });
    this.render();
  }

  /** The rows that pass the search and the block filter, in the chosen order. */
  visibleRows() {
    const found = this.rows.filter((r) => inScope(r, this.state.scope) && matches(r, this.state.query));
    if (this.state.sort) {
      const col = this.columns.find((c) => c.key === this.state.sort);
      found.sort((a, b) => {
        const x = col.sort(a);
        const y = col.sort(b);
        return (x < y ? -1 : x > y ? 1 : 0) * this.state.dir || a.index - b.index;
      });
    }
    return found;
  }

  sortBy(th) {
    if (!th) return;
    const key = th.getAttribute("data-key");
    if (this.state.sort === key) this.state.dir = -this.state.dir;
    else {
      this.state.sort = key;
      this.state.dir = this.columns.find((c) => c.key === key).num ? -1 : 1; // numbers: largest first
    }
    this.render();
  }

  filter(change) {
    Object.assign(this.state, change, { limit: ROW_PAGE });
    this.render();
  }

  row(row) {
    const tr = h("tr", { "data-node-id": row.id, title: "Show in the picture" }, ...this.columns.map((c) => cell(row, c.key)));
    tr.addEventListener("click", () => this.onSelect && this.onSelect(row.index));
    return tr;
  }

  render() {
    const found = this.visibleRows();
    const all = this.totals;
    this.body.replaceChildren(...found.slice(0, this.state.limit).map((r) => this.row(r)));
    const filtered = found.length !== this.rows.length;
    const sub = { params: sum(found, "params"), flops: sum(found, "flops"), saved: all.saved === null ? null : sum(found, "saved") };
    this.foot.replaceChildren(...[
      filtered ? totalsRow(this.columns, `Shown (${found.length} of ${this.rows.length})`, sub, "nt-subtotal") : null,
      totalsRow(this.columns, `Total (${this.rows.length} layers)`, all, "nt-total")].filter(Boolean));
    this.shown.textContent = filtered ? `${found.length} of ${this.rows.length} layers` : `${this.rows.length} layers`;
    const left = found.length - Math.min(found.length, this.state.limit);
    this.more.hidden = left <= 0;
    this.more.textContent = left > 0 ? `Show ${Math.min(left, ROW_PAGE)} more (${left} not shown)` : "";
    for (const th of this.head.children) {
      const key = th.getAttribute("data-key");
      th.setAttribute("aria-sort", key === this.state.sort ? (this.state.dir > 0 ? "ascending" : "descending") : "none");
    }
  }
}

export function createTable(model, options = {}) {
  return new LayerTable(model, options);
}
