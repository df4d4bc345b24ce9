// Tiny DOM builders. Text always goes through textContent, attributes through setAttribute:
// nothing the trace contains is ever parsed as HTML.

export const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v == null || v === false) continue;
    if (k === "text") el.textContent = String(v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
}

/** An HTML element: h("div", {class: "fv-x", text: "..."}, ...children). */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  apply(el, props);
  append(el, children);
  return el;
}

/** An SVG element, same signature as h. */
export function s(tag, props = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, props);
  append(el, children);
  return el;
}

/** An SVG <title> (the browser's tooltip), as text. */
export function tip(text) {
  return s("title", { text });
}

/** Toggle a class on an element (classList works on SVG elements too). */
export function toggle(el, cls, on) {
  el.classList.toggle(cls, Boolean(on));
}
