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

export function createPicture(model, { onChange } = {}) {
  instances += 1;
  const arrowId = `nt-arrow-${instances}`;
  const deepest = maxDepth(model);
  const state = { level: fittingLevel(model, INITIAL_BOXES), expanded: null, zoom: 1, pinned: null, drawn: null };
  state.expanded = expandedAtLevel(model, state.level);

  const canvas = h("div", { class: "nt-canvas" });
  const tip = h("div", { class: "nt-tip", hidden: true });
  const panel = h("div", { class: "nt-panel" });
  const status = h("span", { class: "nt-status" });
  const note = h("span", { class: "nt-note" });
  const button = (text, title, onclick, cls = "") => h("button", { type: "button", class: `nt-btn ${cls}`, title, onclick, text });
  const depthLabel = h("span", { class: "nt-depth" });
  const toolbar = h("div", { class: "nt-toolbar" },
    button("−", "Close the deepest open blocks", () => setLevel(state.level - 1), "nt-less"),
    depthLabel,
    button("+", "Open one more level of blocks", () => setLevel(state.level + 1), "nt-more"),
    button("Open all", "Open every block (as deep as fits)", () => setLevel(deepest), "nt-open-all"),
    button("Close all", "Close every block", () => setLevel(0), "nt-close-all"),
    button("Fit", "Fit the drawing to the width", () => zoomTo("fit"), "nt-fit"),
    button("1:1", "Draw at full size", () => zoomTo(1), "nt-full"),
    status, note);
  const stage = h("div", { class: "nt-stage" }, canvas, panel);
  canvas.append(tip);
  const el = h("div", { class: "nt-picture" }, toolbar, stage);

  function boxesFor(expanded) {
    return visibleGraph(model, expanded);
  }

  /** Draws `expanded` when it stays within MAX_BOXES; returns whether it did. */
  function apply(expanded, level = null) {
    const vis = boxesFor(expanded);
    if (vis.units.length > MAX_BOXES) {
      note.textContent = `That would draw ${vis.units.length.toLocaleString("en-US")} boxes (at most ${MAX_BOXES}): open single blocks instead.`;
      return false;
    }
    note.textContent = "";
    state.expanded = expanded;
    if (level !== null) state.level = level;
    draw(vis);
    return true;
  }

  function setLevel(level) {
    const target = Math.max(0, Math.min(deepest, level));
    let fit = target;
    while (fit > 0 && countAtLevel(model, fit) > MAX_BOXES) fit -= 1;
    apply(expandedAtLevel(model, fit), fit);
    if (fit < target) {
      note.textContent = `Depth ${target} would draw ${countAtLevel(model, target).toLocaleString("en-US")} boxes `
        + `(at most ${MAX_BOXES}): open single blocks to go deeper.`;
    }
  }

  function toggle(key) {
    const next = new Set(state.expanded);
    if (next.has(key)) {
      for (const k of [...next]) if (k === key || k.startsWith(`${key}.`) || k.startsWith(`${key}#`)) next.delete(k);
    } else {
      next.add(key);
    }
    apply(next);
  }

  function draw(vis) {
    const t0 = performance.now();
    const geo = layoutVisible(vis);
    const svg = s("svg", { class: "nt-svg", viewBox: `0 0 ${geo.width} ${geo.height}`, role: "img",
      "aria-label": `${model.name}: ${vis.units.length} boxes` });
    svg.append(s("defs", {}, s("marker", { id: arrowId, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0 L10,5 L0,10 z", class: "nt-arrowhead" }))));
    const clusters = s("g", { class: "nt-clusters" }, ...geo.clusters.map(drawCluster));
    const edges = s("g", { class: "nt-edges" }, ...geo.edges.map((e) => s("path", {
      class: `nt-edge nt-edge-${e.kind}`, d: pathOf(e.points), "marker-end": `url(#${arrowId})`,
      "data-from": vis.units[e.from].kind === "node" ? vis.units[e.from].node.id : null,
      "data-to": vis.units[e.to].kind === "node" ? vis.units[e.to].node.id : null })));
    const boxes = s("g", { class: "nt-boxes" }, ...geo.boxes.map((box, i) => drawBox(box, vis.units[i], i)));
    svg.append(clusters, edges, boxes);
    for (const old of canvas.querySelectorAll("svg")) old.remove();
    canvas.prepend(svg);
    state.drawn = { vis, geo, svg, ms: performance.now() - t0 };
    const layers = model.nodes.length;
    status.textContent = `${vis.units.length} of ${layers} boxes`;
    depthLabel.textContent = `depth ${state.level}/${deepest}`;
    el.dataset.boxes = String(vis.units.length);
    el.dataset.renderMs = state.drawn.ms.toFixed(1);
    applyZoom();
    markPinned();
    if (onChange) onChange(state);
  }

  function applyZoom() {
    const geo = state.drawn && state.drawn.geo;
    if (!geo) return;
    let zoom = state.zoom;
    if (zoom === "fit") zoom = Math.min(1, Math.max(0.2, (canvas.clientWidth - 4) / Math.max(1, geo.width)));
    state.drawn.svg.setAttribute("width", String(Math.ceil(geo.width * zoom)));
    state.drawn.svg.setAttribute("height", String(Math.ceil(geo.height * zoom)));
  }

  function zoomTo(zoom) {
    state.zoom = zoom;
    applyZoom();
  }

  function unitAt(target) {
    const box = target.closest && target.closest("[data-unit]");
    if (!box || !state.drawn) return null;
    return state.drawn.vis.units[Number(box.getAttribute("data-unit"))] || null;
  }

  function showPanel(unit) {
    panel.replaceChildren();
    if (!unit) {
      panel.append(h("div", { class: "nt-hint", text: "Hover a box for its facts; click a layer to pin them here, click a block to open it." }));
      return;
    }
    panel.append(unitFacts(model, unit), h("button", { type: "button", class: "nt-btn nt-unpin", text: "Unpin", onclick: () => pin(null) }));
  }

  function markPinned() {
    if (!state.drawn) return;
    for (const old of state.drawn.svg.querySelectorAll(".nt-pinned")) old.classList.remove("nt-pinned");
    if (state.pinned) {
      const found = findNode(state.drawn.svg, state.pinned.id);
      if (found) found.classList.add("nt-pinned");
    }
  }

  function pin(node) {
    state.pinned = node;
    showPanel(node ? { kind: "node", node } : null);
    markPinned();
  }

  canvas.addEventListener("mousemove", (event) => {
    const unit = unitAt(event.target);
    if (!unit) {
      tip.hidden = true;
      return;
    }
    tip.replaceChildren(unitFacts(model, unit));
    tip.hidden = false;
    const rect = canvas.getBoundingClientRect();
    tip.style.left = `${event.clientX - rect.left + canvas.scrollLeft + 14}px`;
    tip.style.top = `${event.clientY - rect.top + canvas.scrollTop + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (event) => {
    const header = event.target.closest && event.target.closest(".nt-cluster-label");
    if (header) {
      toggle(header.parentNode.getAttribute("data-scope"));
      return;
    }
    const unit = unitAt(event.target);
    if (!unit) return;
    tip.hidden = true;
    if (unit.kind === "group") toggle(unit.group.key);
    else pin(unit.node);
  });

  showPanel(null);
  apply(state.expanded);

  return {
    el,
    state,
    setLevel,
    toggle,
    /** Opens the blocks around layer `index`, pins it and scrolls it into view. */
    reveal(index) {
      const node = model.nodes[index];
      if (!apply(reveal(model, state.expanded, index))) return;
      pin(node);
      const found = findNode(state.drawn.svg, node.id);
      if (found && found.scrollIntoView) found.scrollIntoView({ block: "nearest", inline: "nearest" });
    },
    relayout: applyZoom,
  };
}
