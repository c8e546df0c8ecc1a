// Graphs for the tests: the traced ResNet-18 the Python tests use, and small hand-written ones.
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

export function traced(name) {
  return JSON.parse(readFileSync(resolve(here, "../../tests/data", `${name}.neurarch.json`), "utf8"));
}

/** A graph from [id, type, scope, params, extra] rows chained in order (plus explicit edges). */
export function graph(rows, { edges = null, measured = {} } = {}) {
  const components = rows.map(([id, type, scope, params = 0, extra = {}]) => ({
    id, name: extra.name || (scope ? `${scope}.${id}` : id), type, ...(scope ? { scope } : {}),
    params: extra.params || {}, inputShape: extra.inputShape || [4], outputShape: extra.outputShape || [4],
    measured: { params, flops: extra.flops ?? 8, ...(extra.measured || {}) },
  }));
  const connections = (edges || rows.slice(1).map((row, i) => [rows[i][0], row[0]])).map(([from, to], i) => ({ id: `e${i}`, from, to }));
  return { id: "g", name: "G", components, connections, measured: { batchSize: 1, ...measured } };
}

/** A flat chain of n linear layers (no scope), between an input and an output. */
export function flatChain(n) {
  const rows = [["x", "input", ""]];
  for (let i = 0; i < n; i += 1) rows.push([`l${i}`, "linear", "", 72, { name: String(i) }]);
  rows.push(["out", "output", ""]);
  return graph(rows);
}
