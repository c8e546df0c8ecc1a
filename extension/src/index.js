// Entry point, in both hosts.
//
// In a notebook, anywidget imports this module and calls `initialize` once per widget model and
// `render` once per view; synced traitlets (model.get / change events) are the whole contract with
// neurarch_trace/notebook/widget.py, plus two custom messages: {type: "ready"} tells the kernel
// that this front end runs the widget (the kernel then swaps its fallback output for the widget
// view), and {type: "plan", id, share, host} asks for the plan, answered by {type: "answer", id,
// ok, error, reported} with the same id.
//
// On the share page (/p/<id>) the same module finds [data-neurarch-share], fetches the share's JSON
// from the same origin and draws the same view in place of the page's static fallback.

import { h } from "./dom.js";
import css from "./style.css";
import { mount, staticHost } from "./view.js";

/** How long the page waits for the kernel's answer to a plan request: the HTTP timeout of the plan
 *  client (30 s), plus a kernel busy with queued cells. */
export const PLAN_TIMEOUT_MS = 120_000;
const STYLE_ID = "neurarch-widget-style";

export function injectStyle(el) {
  const root = el.getRootNode ? el.getRootNode() : el.ownerDocument;
  const doc = el.ownerDocument || document;
  const target = root && root.nodeType === 11 ? root : doc.head || doc.documentElement;
  if (target.querySelector && target.querySelector(`#${STYLE_ID}`)) return;
  target.append(h("style", { id: STYLE_ID, text: css }));
}

let sequence = 0;

export function widgetHost(model, timeoutMs = PLAN_TIMEOUT_MS) {
  const pending = new Map();
  const onMessage = (msg) => {
    if (!msg || msg.type !== "answer" || !pending.has(msg.id)) return;
    const { resolve, timer } = pending.get(msg.id);
    pending.delete(msg.id);
    clearTimeout(timer);
    resolve(msg);
  };
  model.on("msg:custom", onMessage);
  return {
    get: (key) => {
      const value = model.get(key);
      return value === undefined ? null : value;
    },
    on: (key, callback) => {
      model.on(`change:${key}`, callback);
      return () => model.off(`change:${key}`, callback);
    },
    plan(share) {
      sequence += 1;
      const id = `${Date.now().toString(36)}-${sequence}`;
      return new Promise((resolve) => {
        const timer = setTimeout(() => {
          pending.delete(id);
          resolve({ ok: false, error: `no answer from the kernel in ${Math.round(timeoutMs / 1000)} s: is it still running? Run the cell again to reconnect` });
        }, timeoutMs);
        pending.set(id, { resolve, timer });
        try {
          model.send({ type: "plan", id, share: Boolean(share), host: model.get("host") });
        } catch (err) {
          clearTimeout(timer);
          pending.delete(id);
          resolve({ ok: false, error: `could not reach the kernel: ${err && err.message ? err.message : err}` });
        }
      });
    },
    destroy() {
      model.off("msg:custom", onMessage);
      for (const { timer } of pending.values()) clearTimeout(timer);
      pending.clear();
    },
  };
}

function initialize({ model }) {
  try {
    model.send({ type: "ready" });
  } catch (_err) {
    // no kernel (a saved view): the fallback output stays
  }
}

function render({ model, el }) {
  injectStyle(el);
  const host = widgetHost(model);
  let view;
  try {
    view = mount(el, host);
  } catch (err) {
    el.replaceChildren(h("pre", { class: "neurarch-fallback", text: `${model.get("text") || ""}\n\n(the neurarch view failed to draw: ${err && err.message ? err.message : err})` }));
    console.error(err);
  }
  return () => {
    if (view) view.destroy();
    host.destroy();
  };
}

export default { initialize, render };

// ------------------------------------------------------------------------------ the share page

function shareState(doc, pageUrl) {
  const plan = doc.plan && typeof doc.plan === "object" ? doc.plan : {};
  const run = plan.run && typeof plan.run === "object" ? plan.run : {};
  return {
    graph: doc.graph,
    card: typeof doc.text === "string" ? doc.text : null,
    url: pageUrl,
    planned: true,
    blockers: Array.isArray(run.blockers) ? run.blockers.map(String) : [],
    warnings: Array.isArray(plan.warnings) ? plan.warnings.map(String) : [],
    blocked: run.legal === false || (Array.isArray(run.blockers) && run.blockers.length > 0),
  };
}

export async function mountShare(root, fetcher = fetch) {
  const source = root.getAttribute("data-neurarch-share");
  const pageUrl = root.getAttribute("data-share-url") || root.ownerDocument.location.href.split("#")[0];
  try {
    const answer = await fetcher(source, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!answer.ok) throw new Error(`${source} answered ${answer.status}`);
    const doc = await answer.json();
    injectStyle(root);
    const holder = h("div");
    mount(holder, staticHost(shareState(doc, pageUrl)), { tableOpen: true });
    root.replaceChildren(...holder.childNodes);
    root.setAttribute("data-neurarch-mounted", "");
    root.dataset.mountedAt = String(performance.now()); // for bench/bench_widget.py
  } catch (err) {
    root.prepend(h("p", { class: "nt-muted", text: `The interactive view did not load (${err && err.message ? err.message : err}); this is the page without it.` }));
  }
}

if (typeof document !== "undefined") {
  const root = document.querySelector("[data-neurarch-share]");
  if (root && !root.hasAttribute("data-neurarch-mounted")) mountShare(root);
}
