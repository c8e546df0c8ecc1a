// The whole view, the same in both hosts (the notebook widget and the share page): summary and
// measured memory, the plan part, the picture and the layer table.
//
// A host is {get(key), on(key, callback) -> off, plan?(share) -> Promise<answer>}. Its keys: graph
// (a .neurarch.json document), card, url, planned, blockers, warnings, blocked, error, share_error,
// traceback, note, labels, notices, working, path.

import { h } from "./dom.js";
import { normalize } from "./graph.js";
import { createPicture } from "./picture.js";
import { createPlanPanel } from "./plan.js";
import { memoryElement, summaryElement } from "./summary.js";
import { createTable } from "./table.js";

export function mount(el, host, { tableOpen = false } = {}) {
  const doc = el.ownerDocument || document;
  const model = normalize(host.get("graph"));
  const summary = summaryElement(model);
  const memory = memoryElement(model);
  const plan = createPlanPanel(host, doc);
  const picture = createPicture(model);
  const table = createTable(model, { onSelect: (index) => picture.reveal(index) });
  const layers = table.rows.length;
  const tableBox = h("details", { class: "nt-section nt-table-section", open: tableOpen },
    h("summary", { text: `Layers (${layers})` }), table.el);
  const footer = h("div", { class: "nt-footer nt-muted" });
  const root = h("div", { class: "neurarch-widget nt-root" }, summary, memory, plan.el, picture.el, tableBox, footer);

  function update() {
    const planned = host.get("card") !== null && host.get("card") !== undefined;
    summary.hidden = planned;
    const path = host.get("path");
    const parts = [];
    if (path) parts.push(h("span", {}, "Graph written to ", h("code", { text: path })));
    else if (host.plan) parts.push(h("span", { text: "Graph not saved" }));
    if (!planned && !host.get("error") && host.plan) parts.push(h("span", { text: " · Not planned: nothing was sent." }));
    footer.replaceChildren(...parts);
    footer.hidden = parts.length === 0;
  }
  const offs = ["card", "path", "error"].map((k) => host.on(k, update));
  update();
  el.replaceChildren(root);
  // The drawing fits its width once the element is on the page.
  const view = doc.defaultView;
  const later = view && view.requestAnimationFrame ? view.requestAnimationFrame.bind(view) : (f) => setTimeout(f, 0);
  later(() => picture.relayout());
  return {
    el: root,
    picture,
    table,
    destroy() {
      offs.forEach((off) => off && off());
      plan.destroy();
    },
  };
}

/** A host over a fixed state object (the share page, tests): nothing changes, nothing is sent. */
export function staticHost(state) {
  return { get: (key) => (key in state ? state[key] : null), on: () => () => {} };
}
