// Layered layout of what is visible (graph.js visibleGraph) with dagre, the maintained Sugiyama-style
// layout library (@dagrejs/dagre): open blocks are dagre clusters, so their boxes enclose their
// layers. Only the visible units are laid out, so a collapsed 10,000-layer graph costs as much as
// its screenful of boxes.

import dagre from "@dagrejs/dagre";
import { count, shapeText } from "./format.js";
import { MERGE_TYPES } from "./graph.js";

export const CHAR_W = 7.2; // px per character of the 12 px monospace font the labels use
const LINE_H = 15;
const PAD_X = 10;

const relativeName = (node, parentKey) => {
  if (parentKey) {
    const prefix = `${parentKey.split("#")[0]}.`;
    if (node.name.startsWith(prefix)) return node.name.slice(prefix.length);
  }
  return node.name;
};

/** The text lines and size of one box. */
export function boxOf(unit) {
  if (unit.kind === "group") {
    const g = unit.group;
    const lines = [g.label, `${g.leaves} layer${g.leaves === 1 ? "" : "s"} · ${count(g.params)} params`];
    return { lines, shape: "group", ...size(lines, 44) };
  }
  const node = unit.node;
  if (MERGE_TYPES.has(node.type)) {
    const lines = [node.type === "add" ? "+" : node.type === "stack" ? "stack" : "cat"];
    return { lines, shape: "merge", width: Math.max(28, lines[0].length * CHAR_W + 14), height: 28 };
  }
  const name = relativeName(node, unit.parent);
  if (node.type === "input" || node.type === "output") {
    const shape = node.type === "input" ? node.outputShape : node.inputShape;
    const lines = [name, shapeText(shape)];
    return { lines, shape: "io", ...size(lines, 38) };
  }
  const lines = [name, `${node.type} · ${shapeText(node.outputShape)}`];
  return { lines, shape: "layer", ...size(lines, 38) };
}

function size(lines, height) {
  const longest = Math.max(...lines.map((l) => l.length));
  return { width: Math.max(64, Math.ceil(longest * CHAR_W) + 2 * PAD_X), height: Math.max(height, lines.length * LINE_H + 8) };
}

/**
 * Positions for a visible graph: {width, height, boxes: [{x, y, width, height, lines, shape}] in unit
 * order (x, y: top-left), clusters: [{x, y, width, height, group}], edges: [{points, kind, count}]}.
 */
export function layoutVisible(vis, { rankdir = "TB" } = {}) {
  const g = new dagre.graphlib.Graph({ compound: true, multigraph: false });
  g.setGraph({ rankdir, nodesep: 18, ranksep: 26, edgesep: 8, marginx: 8, marginy: 8 });
  g.setDefaultEdgeLabel(() => ({}));
  const boxes = vis.units.map(boxOf);
  vis.clusters.forEach((c) => g.setNode(`c:${c.group.key}`, { label: c.group.label }));
  vis.clusters.forEach((c) => { if (c.parent !== null) g.setParent(`c:${c.group.key}`, `c:${c.parent}`); });
  boxes.forEach((box, i) => {
    g.setNode(`u:${i}`, { width: box.width, height: box.height });
    const parent = vis.units[i].parent;
    if (parent !== null) g.setParent(`u:${i}`, `c:${parent}`);
  });
  vis.edges.forEach((e) => g.setEdge(`u:${e.from}`, `u:${e.to}`, { weight: e.kind === "flow" ? 2 : 1 }));
  dagre.layout(g);
  const placed = boxes.map((box, i) => {
    const n = g.node(`u:${i}`);
    return { ...box, x: n.x - box.width / 2, y: n.y - box.height / 2 };
  });
  const clusters = vis.clusters.map((c) => {
    const n = g.node(`c:${c.group.key}`);
    return { group: c.group, x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height };
  });
  const edges = vis.edges.map((e) => ({ ...e, points: g.edge(`u:${e.from}`, `u:${e.to}`).points }));
  const graph = g.graph();
  return { width: Math.ceil(graph.width || 0), height: Math.ceil(graph.height || 0), boxes: placed, clusters, edges };
}
