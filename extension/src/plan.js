// The plan part of the view: the card as the service rendered it, the share link with a copy button,
// blockers and warnings, and the plan button with its states (ready, working, failed, planned).
//
// The button asks the host for the plan (host.plan(share) -> Promise<{ok, error}>): the notebook host
// sends a message matched by an id that the kernel always answers, error included, and gives up
// with an error after a timeout, so the page never waits forever. Hosts without a kernel (the
// share page) have no host.plan: the button is not drawn.

import { copyText, h } from "./dom.js";

export const COPY_LABEL = "Copy link";

const SPINNER = () => {
  const span = h("span", { class: "nt-spinner", "aria-hidden": "true" });
  return span;
};

function linkElement(url, doc) {
  const copy = h("button", { type: "button", class: "nt-btn neurarch-copy", title: "Copy the share link", "data-url": url, text: COPY_LABEL });
  copy.addEventListener("click", async () => {
    const ok = await copyText(url, doc);
    copy.textContent = ok ? "Copied" : "Select the link and copy it";
    setTimeout(() => { copy.textContent = COPY_LABEL; }, 1500);
  });
  return h("div", { class: "neurarch-link" }, h("b", { text: "Share: " }),
    h("a", { class: "neurarch-share-link", href: url, target: "_blank", rel: "noopener noreferrer", text: url }), " ", copy);
}

function issuesElement(get) {
  if (!get("planned")) return null;
  const blockers = get("blockers") || [];
  const warnings = get("warnings") || [];
  const list = (items) => h("ul", {}, ...items.map((t) => h("li", { text: t })));
  const b = blockers.length
    ? h("div", { class: "neurarch-blockers nt-bad" }, h("b", { text: `Blockers (${blockers.length})` }), list(blockers))
    : get("blocked") ? h("div", { class: "neurarch-blockers nt-bad" }, h("b", { text: "Blocked:" }), " the plan says the graph would not run")
      : h("div", { class: "neurarch-blockers" }, h("b", { text: "Blockers:" }), " none");
  const w = warnings.length
    ? h("div", { class: "neurarch-warnings nt-warn" }, h("b", { text: `Warnings (${warnings.length})` }), list(warnings))
    : h("div", { class: "neurarch-warnings" }, h("b", { text: "Warnings:" }), " none");
  return h("div", { class: "nt-issues" }, b, w);
}

function errorElement(get, local) {
  const parts = [];
  const error = local || get("error");
  if (error) {
    parts.push(h("div", { class: "neurarch-error nt-bad" }, h("b", { text: "Plan failed: " }), error));
    const tb = !local && get("traceback");
    if (tb) parts.push(h("details", {}, h("summary", { class: "nt-muted", text: "traceback" }), h("pre", { class: "nt-pre", text: tb })));
  }
  if (get("share_error")) parts.push(h("div", { class: "neurarch-share-error nt-warn" }, h("b", { text: "No share link: " }), get("share_error")));
  if (get("note")) parts.push(h("div", { class: "nt-muted nt-plan-note", text: get("note") }));
  return parts.length ? h("div", { class: "nt-status-lines" }, ...parts) : null;
}

export function createPlanPanel(host, doc) {
  const get = (key) => host.get(key);
  const el = h("div", { class: "nt-plan" });
  const local = { pending: false, error: null, share: false };

  async function click() {
    if (local.pending || get("working")) return;
    local.pending = true;
    local.error = null;
    render();
    const answer = await host.plan(local.share || Boolean(get("card")));
    local.pending = false;
    local.error = answer && answer.ok === false && !answer.reported ? answer.error || "the plan request failed" : null;
    render();
  }

  function controls() {
    if (!host.plan) return null;
    const planned = get("card") !== null && get("card") !== undefined;
    if (planned && get("url")) return null;
    const labels = get("labels") || {};
    const notices = get("notices") || {};
    const working = local.pending || get("working");
    const mode = planned ? "link" : local.share ? "share" : "plan";
    const button = h("button", { type: "button", class: "nt-btn nt-primary neurarch-plan-button", title: notices[planned || local.share ? "share" : "plan"] || "",
      disabled: working, text: working ? "Working..." : labels[mode] || "Get the plan" });
    button.addEventListener("click", click);
    const box = planned ? null : h("label", { class: "nt-share-box" },
      h("input", { type: "checkbox", checked: local.share, disabled: working, onchange: (e) => { local.share = e.target.checked; render(); } }),
      " also make a public share link (anyone with the link can open it)");
    return h("div", { class: "nt-controls" }, button, box);
  }

  function render() {
    const card = get("card");
    const url = get("url");
    const working = local.pending || get("working");
    el.replaceChildren(...[
      card !== null && card !== undefined ? h("pre", { class: "neurarch-card nt-pre", text: card.replace(/\n$/, "") }) : null,
      url ? linkElement(url, doc) : null,
      issuesElement(get),
      working ? h("div", { class: "neurarch-working nt-muted" }, SPINNER(), get("labels")?.working || "Working: waiting for the plan…") : errorElement(get, local.error),
      controls(),
    ].filter(Boolean));
  }

  const keys = ["card", "url", "blockers", "warnings", "planned", "blocked", "error", "share_error", "traceback", "labels", "notices", "working", "note"];
  const offs = keys.map((k) => host.on(k, render));
  render();
  return { el, render, destroy: () => offs.forEach((off) => off && off()) };
}
