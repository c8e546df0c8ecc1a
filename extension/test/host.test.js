import { afterEach, describe, expect, it, vi } from "vitest";
import { mountShare, widgetHost } from "../src/index.js";
import { createPlanPanel } from "../src/plan.js";
import { staticHost } from "../src/view.js";
import { traced } from "./fixtures.js";

/** A model as anywidget hands it to the front end: get/set/on/off/send. */
function fakeModel(state) {
  const handlers = new Map();
  const sent = [];
  return {
    sent,
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; (handlers.get(`change:${k}`) || []).forEach((f) => f()); },
    on: (name, f) => handlers.set(name, [...(handlers.get(name) || []), f]),
    off: (name, f) => handlers.set(name, (handlers.get(name) || []).filter((g) => g !== f)),
    send: (msg) => sent.push(msg),
    emit: (msg) => (handlers.get("msg:custom") || []).forEach((f) => f(msg)),
  };
}

afterEach(() => vi.useRealTimers());

describe("the plan request", () => {
  it("is matched to its answer by id", async () => {
    const model = fakeModel({ host: "127.0.0.1:9" });
    const host = widgetHost(model);
    const answer = host.plan(true);
    const [msg] = model.sent;
    expect(msg).toMatchObject({ type: "plan", share: true, host: "127.0.0.1:9" });
    model.emit({ type: "answer", id: "someone-else", ok: false });
    model.emit({ type: "answer", id: msg.id, ok: true, error: null });
    await expect(answer).resolves.toMatchObject({ id: msg.id, ok: true });
  });

  it("ends with an error when the kernel never answers", async () => {
    vi.useFakeTimers();
    const host = widgetHost(fakeModel({}), 1000);
    const answer = host.plan(false);
    vi.advanceTimersByTime(1001);
    await expect(answer).resolves.toMatchObject({ ok: false, error: expect.stringContaining("no answer from the kernel") });
  });

  it("ends with an error when the message cannot be sent", async () => {
    const model = fakeModel({});
    model.send = () => { throw new Error("no comm"); };
    await expect(widgetHost(model).plan(false)).resolves.toMatchObject({ ok: false, error: "could not reach the kernel: no comm" });
  });
});

describe("the plan panel", () => {
  const labels = { plan: "Get the plan: send the graph (4 layers, no weights) to h:1", share: "Get the plan and a public link: send the graph (4 layers, no weights) to h:1",
    link: "Get a public share link: send ...", working: "Working: sending the graph to h:1 and waiting for the plan…" };

  it("labels, works, then shows the card, the link and the issues", async () => {
    const model = fakeModel({ labels, notices: { plan: "n1", share: "n2" }, card: null, url: null, working: false });
    const host = widgetHost(model);
    const panel = createPlanPanel(host, document);
    document.body.append(panel.el);
    const btn = () => panel.el.querySelector("button.neurarch-plan-button");
    expect(btn().textContent).toBe(labels.plan);
    panel.el.querySelector("input[type=checkbox]").click();
    expect(btn().textContent).toBe(labels.share);
    btn().click();
    expect(btn().disabled).toBe(true);
    expect(panel.el.querySelector(".neurarch-working").textContent).toContain("Working: sending");
    const [msg] = model.sent;
    expect(msg.share).toBe(true);
    model.set("card", "+--+\n|ok|\n+--+\n");
    model.set("url", "http://h:1/p/abc");
    model.set("planned", true);
    model.set("warnings", ["no dropout before the classifier 'fc'"]);
    model.set("blockers", []);
    model.emit({ type: "answer", id: msg.id, ok: true });
    await new Promise((r) => setTimeout(r, 0));
    expect(panel.el.querySelector("pre.neurarch-card").textContent).toBe("+--+\n|ok|\n+--+");
    expect(panel.el.querySelector("a.neurarch-share-link").getAttribute("href")).toBe("http://h:1/p/abc");
    expect(panel.el.querySelector(".neurarch-warnings").textContent).toContain("no dropout");
    expect(panel.el.querySelector(".neurarch-blockers").textContent).toContain("none");
    expect(btn()).toBe(null); // planned and shared: nothing left to ask for
    panel.el.remove();
  });

  it("shows a failure the page found itself (a timeout) as one line", async () => {
    const host = { get: (k) => ({ labels, card: null })[k] ?? null, on: () => () => {}, plan: async () => ({ ok: false, error: "no answer from the kernel in 120 s" }) };
    const panel = createPlanPanel(host, document);
    panel.el.querySelector("button.neurarch-plan-button").click();
    await new Promise((r) => setTimeout(r, 0));
    expect(panel.el.querySelector(".neurarch-error").textContent).toBe("Plan failed: no answer from the kernel in 120 s");
    expect(panel.el.querySelector("button.neurarch-plan-button").disabled).toBe(false);
  });

  it("draws no button where there is no kernel, and copies the link", async () => {
    const writes = [];
    Object.defineProperty(window, "isSecureContext", { value: true, configurable: true });
    Object.defineProperty(navigator, "clipboard", { value: { writeText: async (t) => writes.push(t) }, configurable: true });
    const panel = createPlanPanel(staticHost({ card: "+\n", url: "http://h/p/x", planned: true, blockers: [], warnings: [] }), document);
    expect(panel.el.querySelector("button.neurarch-plan-button")).toBe(null);
    const copy = panel.el.querySelector("button.neurarch-copy");
    copy.click();
    await new Promise((r) => setTimeout(r, 0));
    expect(writes).toEqual(["http://h/p/x"]);
    expect(copy.textContent).toBe("Copied");
  });
});

describe("the share page", () => {
  it("replaces the static page with the view", async () => {
    const root = document.createElement("div");
    root.setAttribute("data-neurarch-share", "abc.json");
    root.setAttribute("data-share-url", "http://h/p/abc");
    root.innerHTML = "<pre>static card</pre>";
    document.body.append(root);
    const doc = { text: "+--+\n", graph: traced("traced_resnet18"), plan: { run: { legal: true, blockers: [] }, warnings: ["w1"] } };
    const asked = [];
    await mountShare(root, async (url) => { asked.push(url); return { ok: true, json: async () => doc }; });
    expect(asked).toEqual(["abc.json"]);
    expect(root.querySelector("pre.neurarch-card").textContent).toBe("+--+");
    expect(root.querySelector("a.neurarch-share-link").textContent).toBe("http://h/p/abc");
    expect(root.querySelectorAll("[data-node-id]").length).toBeGreaterThan(0);
    expect(root.querySelector(".nt-table-section").open).toBe(true);
    expect(root.textContent).not.toContain("static card");
    root.remove();
  });

  it("keeps the static page when the JSON does not load", async () => {
    const root = document.createElement("div");
    root.setAttribute("data-neurarch-share", "abc.json");
    root.innerHTML = "<pre>static card</pre>";
    await mountShare(root, async () => ({ ok: false, status: 404 }));
    expect(root.textContent).toContain("static card");
    expect(root.textContent).toContain("The interactive view did not load (abc.json answered 404)");
  });
});
