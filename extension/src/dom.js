// Small DOM helpers. Every text reaches the page through textContent or setAttribute, never as
// markup, so names from a graph cannot inject anything.

const SVG_NS = "http://www.w3.org/2000/svg";

/** h("div", {class: "x", onclick: f}, child, "text", ...) -> HTMLElement */
export function h(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG elements. */
export function s(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Puts `text` on the clipboard: the Clipboard API where the page allows it, else a selected
 *  textarea and execCommand("copy"). Resolves true when the text was copied. */
export async function copyText(text, doc = document) {
  const view = doc.defaultView || window;
  if (view.navigator && view.navigator.clipboard && view.isSecureContext) {
    try {
      await view.navigator.clipboard.writeText(text);
      return true;
    } catch (_err) {
      // refused (no permission, not focused): fall back below
    }
  }
  const area = doc.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  doc.body.append(area);
  area.select();
  let ok = false;
  try {
    ok = doc.execCommand("copy");
  } catch (_err) {
    ok = false;
  }
  area.remove();
  return ok;
}
