// The graph as the picture sees it: the .neurarch.json components and connections (the format in
// /work/shared/spec/neurarch-graph.md, `measured` fields in docs/measured.md), nested into a tree of
// blocks by `scope`, and the part of it that is visible for a set of expanded blocks.
//
// A block is a scope prefix: "layer1" holds "layer1.0" and "layer1.1", which hold the layers whose
// scope they are. A block with more than MAX_CHILDREN children is split into runs of consecutive
// children ("0 … 39"), so even a flat stack of thousands of layers opens a screenful at a time.

export const MERGE_TYPES = new Set(["add", "concatenate", "stack"]);
export const MAX_CHILDREN = 40;

const lastSegment = (name) => {
  const text = String(name);
  const dot = text.lastIndexOf(".");
  return dot >= 0 ? text.slice(dot + 1) : text;
};

function newGroup(key, label, parent, synthetic = false) {
  return { key, label, parent, synthetic, depth: parent ? parent.depth + 1 : 0, children: [], leaves: 0, params: 0, flops: 0 };
}

/** Reads a graph document; tolerates missing fields (a reader of the format must). */
export function normalize(doc) {
  const source = doc && typeof doc === "object" ? doc : {};
  const nodes = [];
  const byId = new Map();
  for (const comp of Array.isArray(source.components) ? source.components : []) {
    if (!comp || typeof comp.id !== "string" || byId.has(comp.id)) continue;
    const measured = comp.measured && typeof comp.measured === "object" ? comp.measured : {};
    const node = {
      index: nodes.length,
      id: comp.id,
      name: String(comp.name ?? comp.id),
      type: String(comp.type ?? "?"),
      scope: typeof comp.scope === "string" && comp.scope ? comp.scope : "",
      inputShape: Array.isArray(comp.inputShape) ? comp.inputShape : null,
      outputShape: Array.isArray(comp.outputShape) ? comp.outputShape : null,
      params: comp.params && typeof comp.params === "object" ? comp.params : {},
      measured,
    };
    nodes.push(node);
    byId.set(node.id, node);
  }
  const edges = [];
  for (const conn of Array.isArray(source.connections) ? source.connections : []) {
    const a = conn && byId.get(conn.from);
    const b = conn && byId.get(conn.to);
    if (a && b && a !== b) edges.push([a.index, b.index]);
  }
  const measured = source.measured && typeof source.measured === "object" ? source.measured : {};
  const model = { name: String(source.name ?? "model"), nodes, byId, edges, measured, batch: batchOf(measured) };
  model.root = buildTree(nodes);
  model.groups = indexGroups(model.root);
  return model;
}

function batchOf(measured) {
  const b = measured.batchSize;
  return typeof b === "number" && b > 0 ? b : 1;
}

export const isLayer = (node) => node.type !== "input" && node.type !== "output";

function buildTree(nodes) {
  const root = newGroup("", "", null);
  const groups = new Map([["", root]]);
  for (const node of nodes) {
    let parent = root;
    if (node.scope && isLayer(node)) {
      const parts = node.scope.split(".");
      for (let i = 0; i < parts.length; i += 1) {
        const key = parts.slice(0, i + 1).join(".");
        let group = groups.get(key);
        if (!group) {
          group = newGroup(key, parts[i], parent);
          groups.set(key, group);
          parent.children.push({ group });
        }
        parent = group;
      }
    }
    parent.children.push({ node: node.index });
    node.group = parent;
    const params = typeof node.measured.params === "number" ? node.measured.params : 0;
    const flops = typeof node.measured.flops === "number" ? node.measured.flops : 0;
    for (let g = parent; g; g = g.parent) {
      if (isLayer(node)) g.leaves += 1;
      g.params += params;
      g.flops += flops;
    }
  }
  chunk(root, nodes);
  return root;
}

function edgeLeaf(child, nodes, last) {
  let c = child;
  while (c.group) c = c.group.children[last ? c.group.children.length - 1 : 0];
  return lastSegment(nodes[c.node].name);
}

/** Splits every block with more than MAX_CHILDREN children into runs of consecutive children,
 *  labelled by their first and last layer; inputs and outputs stay outside the runs. */
function chunk(group, nodes) {
  for (const child of group.children) if (child.group) chunk(child.group, nodes);
  const io = (child) => !child.group && !isLayer(nodes[child.node]);
  const head = [];
  const tail = [];
  let body = group.children;
  while (body.length && io(body[0])) head.push(body.shift());
  while (body.length && io(body[body.length - 1])) tail.unshift(body.pop());
  let level = 0;
  while (body.length > MAX_CHILDREN) {
    const runs = [];
    for (let start = 0; start < body.length; start += MAX_CHILDREN) {
      const part = body.slice(start, start + MAX_CHILDREN);
      const key = `${group.key}#${level}.${runs.length}`;
      const label = `${edgeLeaf(part[0], nodes, false)} … ${edgeLeaf(part[part.length - 1], nodes, true)}`;
      const run = newGroup(key, label, group, true);
      run.children = part;
      for (const child of part) {
        if (child.group) child.group.parent = run;
        else nodes[child.node].group = run;
        const source = child.group || { leaves: isLayer(nodes[child.node]) ? 1 : 0, params: nodes[child.node].measured.params || 0, flops: nodes[child.node].measured.flops || 0 };
        run.leaves += source.leaves;
        run.params += source.params;
        run.flops += source.flops;
      }
      runs.push({ group: run });
    }
    body = runs;
    level += 1;
  }
  group.children = [...head, ...body, ...tail];
}

function indexGroups(root) {
  const groups = new Map();
  const visit = (group, depth) => {
    group.depth = depth;
    groups.set(group.key, group);
    for (const child of group.children) if (child.group) visit(child.group, depth + 1);
  };
  visit(root, 0);
  return groups;
}

/** The blocks that contain a node, outermost first (the root excluded). */
export function ancestors(model, index) {
  const chain = [];
  for (let g = model.nodes[index].group; g && g.parent; g = g.parent) chain.unshift(g);
  return chain;
}

/** Keys of the blocks open at depth level `level` (0: every top-level block closed). */
export function expandedAtLevel(model, level) {
  const open = new Set();
  for (const group of model.groups.values()) if (group.parent && group.depth <= level) open.add(group.key);
  return open;
}

/** How many boxes the picture draws at `level`, without building them. */
export function countAtLevel(model, level) {
  const walk = (group) => {
    let n = 0;
    for (const child of group.children) {
      if (child.group && child.group.depth <= level) n += walk(child.group);
      else n += 1;
    }
    return n;
  };
  return walk(model.root);
}

export function maxDepth(model) {
  let depth = 0;
  for (const group of model.groups.values()) depth = Math.max(depth, group.depth);
  return depth;
}

/** The deepest level that draws at most `budget` boxes (level 0 when even that draws more). */
export function fittingLevel(model, budget) {
  let best = 0;
  const deepest = maxDepth(model);
  for (let level = 1; level <= deepest; level += 1) {
    if (countAtLevel(model, level) > budget) break;
    best = level;
  }
  return best;
}

/**
 * What is drawn for the open blocks `expanded` (a Set of keys):
 *   units:    boxes, {kind: "node", node} or {kind: "group", group}, each with the key of the open block
 *             drawn around it (`parent`, null at the top);
 *   clusters: the open blocks, {group, parent};
 *   rep:      for every node index, the index of the unit that shows it;
 *   edges:    {from, to, kind, count} between units; kind "residual" into an add, "concat" into a
 *             concatenate or stack, else "flow"; parallel connections counted once.
 */
export function visibleGraph(model, expanded) {
  const units = [];
  const clusters = [];
  const rep = new Int32Array(model.nodes.length).fill(-1);
  const cover = (group, unit) => {
    for (const child of group.children) {
      if (child.group) cover(child.group, unit);
      else rep[child.node] = unit;
    }
  };
  const walk = (group, parent) => {
    for (const child of group.children) {
      if (child.group && expanded.has(child.group.key)) {
        clusters.push({ group: child.group, parent });
        walk(child.group, child.group.key);
      } else if (child.group) {
        units.push({ kind: "group", group: child.group, parent });
        cover(child.group, units.length - 1);
      } else {
        units.push({ kind: "node", node: model.nodes[child.node], parent });
        rep[child.node] = units.length - 1;
      }
    }
  };
  walk(model.root, null);
  const seen = new Map();
  const edges = [];
  for (const [a, b] of model.edges) {
    const from = rep[a];
    const to = rep[b];
    if (from < 0 || to < 0 || from === to) continue;
    const key = `${from}>${to}`;
    const found = seen.get(key);
    if (found) {
      found.count += 1;
      continue;
    }
    const target = units[to];
    let kind = "flow";
    if (target.kind === "node" && MERGE_TYPES.has(target.node.type)) kind = target.node.type === "add" ? "residual" : "concat";
    const edge = { from, to, kind, count: 1 };
    seen.set(key, edge);
    edges.push(edge);
  }
  return { units, clusters, rep, edges };
}

/** The open-block set that shows node `index`: `expanded` plus every block around it. */
export function reveal(model, expanded, index) {
  const open = new Set(expanded);
  for (const group of ancestors(model, index)) open.add(group.key);
  return open;
}
