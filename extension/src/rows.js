// The layer table's rows and totals, from the normalized graph (graph.js). The rules match
// neurarch_trace/notebook/render.py, which writes the same table as static HTML.

import { isLayer } from "./graph.js";

const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/**
 * Where a layer's parameters live when it owns none of them:
 *   "tied to <embedding>" for an lmHead whose weight is an input embedding's (the embedding owns it);
 *   "shared with <first call>" for a repeated call of a module whose first call owns parameters.
 * A repeated call of a parameter-free module (a ReLU used twice) gets no note.
 */
export function paramsNote(model, node) {
  if (node.type === "lmHead" && node.params.weightTied) {
    const embedding = tiedEmbedding(model, node);
    return `tied to ${embedding ? embedding.name : "the input embedding"}`;
  }
  const first = node.measured.sharedWith ? model.byId.get(node.measured.sharedWith) : null;
  if (first && (num(first.measured.params) || 0) > 0) return `shared with ${first.name}`;
  return null;
}

/** The embedding an lmHead's weight is tied to: the first embedding of the same vocabulary and
 *  width that owns at least vocab x width parameters (the graph records the tie, not the partner). */
export function tiedEmbedding(model, head) {
  const vocab = head.params.vocabSize;
  const dim = head.params.embedDim;
  return model.nodes.find((n) => n.type === "embedding" && n.params.vocabSize === vocab
    && n.params.embeddingDim === dim && (num(n.measured.params) || 0) >= vocab * dim) || null;
}

/** Every operand's shape for a merge (add, concatenate), else the first input's; batchless. */
export function inputShapes(node) {
  const shapes = node.measured.inputShapes;
  if (Array.isArray(shapes) && shapes.length) return shapes;
  return node.inputShape ? [node.inputShape] : [];
}

/** One row per layer (inputs and outputs left out), in graph order. FLOPs and saved bytes are per
 *  sample (the graph's are at its traced batch), like the shapes. */
export function layerRows(model) {
  const batch = model.batch;
  return model.nodes.filter(isLayer).map((node) => {
    const flops = num(node.measured.flops);
    const saved = num(node.measured.savedBytes);
    return {
      index: node.index,
      id: node.id,
      name: node.name,
      type: node.type,
      scope: node.scope,
      inputShapes: inputShapes(node),
      outputShape: node.outputShape,
      params: num(node.measured.params),
      note: paramsNote(model, node),
      flops: flops === null ? null : flops / batch,
      saved: saved === null ? null : saved / batch,
    };
  });
}

/** Whether any layer carries bytes saved for backward (the column shows only then). */
export const hasSaved = (rows) => rows.some((r) => r.saved !== null);

/** The totals row: unique parameters split trainable/frozen (from the graph's measured totals),
 *  FLOPs per sample of the whole forward (functional code included) and saved bytes per sample. */
export function totals(model, rows) {
  const m = model.measured;
  const sum = (key) => rows.reduce((acc, r) => acc + (r[key] || 0), 0);
  const flopsAll = num(m.flops);
  return {
    layers: rows.length,
    params: num(m.params) ?? sum("params"),
    trainable: num(m.trainableParams),
    frozen: num(m.frozenParams),
    flops: flopsAll === null ? sum("flops") : flopsAll / model.batch,
    functionalFlops: num(m.functionalFlops) === null ? null : m.functionalFlops / model.batch,
    saved: hasSaved(rows) ? sum("saved") : null,
  };
}
