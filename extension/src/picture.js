// The picture of the model: a layered drawing (layout.js) of the visible part of the graph
// (graph.js). Blocks open and close on click; hovering a box shows its facts, clicking a layer pins
// them in the side panel. Every drawn layer carries data-node-id (its component id), every block
// data-scope (its scope key).

import { h, s } from "./dom.js";
import { unitFacts } from "./details.js";
import { countAtLevel, expandedAtLevel, fittingLevel, maxDepth, reveal, visibleGraph } from "./graph.js";
import { family } from "./kinds.js";
import { layoutVisible } from "./layout.js";

/** Boxes drawn at first: the deepest level of blocks that stays under this many boxes. */
export const INITIAL_BOXES = 40;
/** Never more boxes at once: dagre's layout time grows faster than the box count. */
export const MAX_BOXES = 500;

let instances = 0;

function findNode(svg, id) {
  for (const el of svg.querySelectorAll("[data-node-id]")) if (el.getAttribute("data-node-id") === id) return el;
  return null;
}

function pathOf(points) {
  return points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
}

function drawBox(box, unit, index) {
  const attrs = { class: "nt-box", "data-unit": index, transform: `translate(${box.x.toFixed(1)},${box.y.toFixed(1)})` };
  let cls;
  if (unit.kind === "group") {
    cls = `nt-box nt-group${unit.group.synthetic ? " nt-run" : ""}`;
    attrs["data-scope"] = unit.group.key;
  } else {
    cls = `nt-box nt-layer nt-f-${family(unit.node.type)}${box.shape === "merge" ? " nt-merge" : ""}`;
    attrs["data-node-id"] = unit.node.id;
  }
  attrs.class = cls;
  const g = s("g", attrs);
  const radius = box.shape === "merge" ? box.height / 2 : box.shape === "io" ? 12 : 4;
  g.append(s("rect", { width: box.width, height: box.height, rx: radius, ry: radius }));
  if (unit.kind === "group") g.append(s("rect", { class: "nt-group-inner", x: 3, y: 3, width: box.width - 6, height: box.height - 6, rx: 3, ry: 3 }));
  const lineH = 15;
  const top = (box.height - box.lines.length * lineH) / 2 + 11;
  box.lines.forEach((line, i) => {
    g.append(s("text", { x: box.width / 2, y: top + i * lineH, class: i === 0 ? "nt-title" : "nt-sub", text: line }));
  });
  return g;
}

function drawCluster(cluster) {
  const label = `${cluster.group.label} ▾`;
  return s("g", { class: "nt-cluster", "data-scope": cluster.group.key },
    s("rect", { x: cluster.x, y: cluster.y, width: cluster.width, height: cluster.height, rx: 6, ry: 6 }),
    s("text", { class: "nt-cluster-label", x: cluster.x + 6, y: cluster.y + 12, text: label }));
}

const button = (text, title, onclick, cls) => h("button", { type: "button", class: `nt-btn ${cls}`, title, onclick, text });

/** The picture of one graph: `el` (the toolbar, the drawing and the side panel) and its state. */
export class Picture {
  constructor(model, { onChange } = {}) {
    instances += 1;
    this.model = model;
    this.onChange = onChange;
    this.arrowId = `nt-arrow-${instances}`;
    this.deepest = maxDepth(model);
    const level = fittingLevel(model, INITIAL_BOXES);
    this.state = { level, expanded: expandedAtLevel(model, level), zoom: 1, pinned: null, drawn: null };
    this.canvas = h("div", { class: "nt-canvas" });
    this.tip = h("div", { class: "nt-tip", hidden: true });
    this.panel = h("div", { class: "nt-panel" });
    this.status = h("span", { class: "nt-status" });
    this.note = h("span", { class: "nt-note" });
    this.depthLabel = h("span", { class: "nt-depth" });
    this.canvas.append(this.tip);
    this.el = h("div", { class: "nt-picture" }, this.toolbar(), h("div", { class: "nt-stage" }, this.canvas, this.panel));
    this.canvas.addEventListener("mousemove", (event) => this.hover(event));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.canvas.addEventListener("click", (event) => this.click(event));
    this.showPanel(null);
    this.apply(this.state.expanded);
  }

  toolbar() {
    return h("div", { class: "nt-toolbar" },
      button("−", "Close the deepest open blocks", () => this.setLevel(this.state.level - 1), "nt-less"),
      this.depthLabel,
      button("+", "Open one more level of blocks", () => this.setLevel(this.state.level + 1), "nt-more"),
      button("Open all", "Open every block (as deep as fits)", () => this.setLevel(this.deepest), "nt-open-all"),
      button("Close all", "Close every block", () => this.setLevel(0), "nt-close-all"),
      button("Fit", "Fit the drawing to the width", () => this.zoomTo("fit"), "nt-fit"),
      button("1:1", "Draw at full size", () => this.zoomTo(1), "nt-full"),
      this.status, this.note);
  }

  /** Draws the open blocks `expanded` when that stays within MAX_BOXES; returns whether it did. */
  apply(expanded, level = null) {
    const vis = visibleGraph(this.model, expanded);
    if (vis.units.length > MAX_BOXES) {
      this.note.textContent = `That would draw ${vis.units.length.toLocaleString("en-US")} boxes (at most ${MAX_BOXES}): open single blocks instead.`;
      return false;
    }
    this.note.textContent = "";
    this.state.expanded = expanded;
    if (level !== null) this.state.level = level;
    this.draw(vis);
    return true;
  }

  /** Opens every block down to `level` (as deep as stays within MAX_BOXES). */
  setLevel(level) {
    const target = Math.max(0, Math.min(this.deepest, level));
    let fit = target;
    while (fit > 0 && countAtLevel(this.model, fit) > MAX_BOXES) fit -= 1;
    this.apply(expandedAtLevel(this.model, fit), fit);
    if (fit < target) {
      this.note.textContent = `Depth ${target} would draw ${countAtLevel(this.model, target).toLocaleString("en-US")} boxes `
        + `(at most ${MAX_BOXES}): open single blocks to go deeper.`;
    }
  }

  /** Opens a closed block, or closes an open one and everything inside it. */
  toggle(key) {
    const next = new Set(this.state.expanded);
    if (next.has(key)) {
      for (const k of [...next]) if (k === key || k.startsWith(`${key}.`) || k.startsWith(`${key}#`)) next.delete(k);
    } else {
      next.add(key);
    }
    this.apply(next);
  }

  draw(vis) {
    const t0 = performance.now();
    const geo = layoutVisible(vis);
    const svg = s("svg", { class: "nt-svg", viewBox: `0 0 ${geo.width} ${geo.height}`, role: "img",
      "aria-label": `${this.model.name}: ${vis.units.length} boxes` });
    svg.append(s("defs", {}, s("marker", { id: this.arrowId, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0 L10,5 L0,10 z", class: "nt-arrowhead" }))));
    const idOf = (unit) => (unit.kind === "node" ? unit.node.id : null);
    const edges = geo.edges.map((e) => s("path", { class: `nt-edge nt-edge-${e.kind}`, d: pathOf(e.points),
      "marker-end": `url(#${this.arrowId})`, "data-from": idOf(vis.units[e.from]), "data-to": idOf(vis.units[e.to]) }));
    svg.append(s("g", { class: "nt-clusters" }, ...geo.clusters.map(drawCluster)), s("g", { class: "nt-edges" }, ...edges),
      s("g", { class: "nt-boxes" }, ...geo.boxes.map((box, i) => drawBox(box, vis.units[i], i))));
    for (const old of this.canvas.querySelectorAll("svg")) old.remove();
    this.canvas.prepend(svg);
    this.state.drawn = { vis, geo, svg, ms: performance.now() - t0 };
    this.status.textContent = `${vis.units.length} of ${this.model.nodes.length} boxes`;
    this.depthLabel.textContent = `depth ${this.state.level}/${this.deepest}`;
    this.el.dataset.boxes = String(vis.units.length);
    this.el.dataset.renderMs = this.state.drawn.ms.toFixed(1);
    this.relayout();
    this.markPinned();
    if (this.onChange) this.onChange(this.state);
  }

  /** Sizes the drawing for the zoom (and, with "fit", the canvas width). */
  relayout() {
    const drawn = this.state.drawn;
    if (!drawn) return;
    let zoom = this.state.zoom;
    if (zoom === "fit") zoom = Math.min(1, Math.max(0.2, (this.canvas.clientWidth - 4) / Math.max(1, drawn.geo.width)));
    drawn.svg.setAttribute("width", String(Math.ceil(drawn.geo.width * zoom)));
    drawn.svg.setAttribute("height", String(Math.ceil(drawn.geo.height * zoom)));
  }

  zoomTo(zoom) {
    this.state.zoom = zoom;
    this.relayout();
  }

  unitAt(target) {
    const box = target.closest && target.closest("[data-unit]");
    if (!box || !this.state.drawn) return null;
    return this.state.drawn.vis.units[Number(box.getAttribute("data-unit"))] || null;
  }

  showPanel(unit) {
    this.panel.replaceChildren();
    if (!unit) {
      this.panel.append(h("div", { class: "nt-hint", text: "Hover a box for its facts; click a layer to pin them here, click a block to open it." }));
      return;
    }
    this.panel.append(unitFacts(this.model, unit), button("Unpin", "Unpin", () => this.pin(null), "nt-unpin"));
  }

  markPinned() {
    const drawn = this.state.drawn;
    if (!drawn) return;
    for (const old of drawn.svg.querySelectorAll(".nt-pinned")) old.classList.remove("nt-pinned");
    const found = this.state.pinned && findNode(drawn.svg, this.state.pinned.id);
    if (found) found.classList.add("nt-pinned");
  }

  pin(node) {
    this.state.pinned = node;
    this.showPanel(node ? { kind: "node", node } : null);
    this.markPinned();
  }

  hover(event) {
    const unit = this.unitAt(event.target);
    if (!unit) {
      this.tip.hidden = true;
      return;
    }
    this.tip.replaceChildren(unitFacts(this.model, unit));
    this.tip.hidden = false;
    const rect = this.canvas.getBoundingClientRect();
    this.tip.style.left = `${event.clientX - rect.left + this.canvas.scrollLeft + 14}px`;
    this.tip.style.top = `${event.clientY - rect.top + this.canvas.scrollTop + 14}px`;
  }

  click(event) {
    const header = event.target.closest && event.target.closest(".nt-cluster-label");
    if (header) {
      this.toggle(header.parentNode.getAttribute("data-scope"));
      return;
    }
    const unit = this.unitAt(event.target);
    if (!unit) return;
    this.tip.hidden = true;
    if (unit.kind === "group") this.toggle(unit.group.key);
    else this.pin(unit.node);
  }

  /** Opens the blocks around layer `index`, pins it and scrolls it into view. */
  reveal(index) {
    const node = this.model.nodes[index];
    if (!this.apply(reveal(this.model, this.state.expanded, index))) return;
    this.pin(node);
    const found = findNode(this.state.drawn.svg, node.id);
    if (found && found.scrollIntoView) found.scrollIntoView({ block: "nearest", inline: "nearest" });
  }
}

export function createPicture(model, options = {}) {
  return new Picture(model, options);
}
