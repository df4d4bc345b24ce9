// Tiny DOM builders. Text always goes through textContent, attributes through setAttribute:
// nothing the trace contains is ever parsed as HTML. Every text, text child, tooltip (`title`, an SVG
// <title>) and aria-label is shown through `visible` (Note: [bidi controls in names] in
// fakeviz/_core/fmt.py): the one place the explorer writes out a name's control characters. Other
// attributes (data-path, ids) keep the name as it is, so a selection names the module it was.
import { visible } from "./format.js";

const SHOWN = new Set(["title", "aria-label", "placeholder", "alt"]);

export const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v == null || v === false) continue;
    if (k === "text") el.textContent = visible(v, true);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : SHOWN.has(k) ? visible(v, true) : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.appendChild(typeof c === "object" ? c : document.createTextNode(visible(c, true)));
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

/** Set `el`'s text, and its tooltip when `title` is given, as `h` does: through `visible`. */
export function setText(el, text, title) {
  el.textContent = visible(text ?? "", true);
  if (title !== undefined) el.setAttribute("title", visible(title, true));
}

/** An SVG <title> (the browser's tooltip), as text. */
export function tip(text) {
  return s("title", { text });
}

/** Toggle a class on an element (classList works on SVG elements too). */
export function toggle(el, cls, on) {
  el.classList.toggle(cls, Boolean(on));
}

/**
 * Call `cb(width)` with `el`'s content width in CSS pixels whenever it changes by more than
 * 2 px (charts are drawn at their real size, so their text is never scaled); returns a
 * function that stops watching. Without ResizeObserver (or before layout) nothing is called.
 */
export function watchWidth(el, cb) {
  if (typeof ResizeObserver === "undefined") return () => {};
  let last = 0;
  let frame = 0;
  const ro = new ResizeObserver((entries) => {
    const w = Math.floor(entries[entries.length - 1].contentRect.width);
    if (w <= 0 || Math.abs(w - last) <= 2) return;
    last = w;
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => cb(w));
  });
  ro.observe(el);
  return () => {
    cancelAnimationFrame(frame);
    ro.disconnect();
  };
}

/** `el`'s width now, or `fallback` when it is not laid out (hidden, detached, jsdom). */
export function widthOf(el, fallback) {
  const w = Math.floor(el.clientWidth || 0);
  return w > 40 ? w : fallback;
}
