// @vitest-environment jsdom
// Control characters in names (Note: [bidi controls in names] in fakeviz/_core/fmt.py): every text and
// tooltip the explorer sets goes through `visible` in js/src/dom.js; attributes the code reads back keep the name.
import { afterEach, describe, expect, it } from "vitest";
import { h, s, setText, tip } from "../src/dom.js";
import widget from "../src/explorer.js";
import { visible } from "../src/format.js";
import { mockModel, state } from "./fixture.js";

const RLO = "\u202e";
const NAME = `attn${RLO}q\u200f\u2066x\u2069`;
const SHOWN = "attn<U+202E>q<U+200F><U+2066>x<U+2069>";

describe("visible", () => {
  it("writes out bidi controls and C0/C1 controls, keeps letters of any script", () => {
    expect(visible(NAME)).toBe(SHOWN);
    expect(visible("a\x1b[31mb\rc\x85d\x7f")).toBe("a<U+001B>[31mb<U+000D>c<U+0085>d<U+007F>");
    expect(visible("a\nb\tc")).toBe("a<U+000A>b<U+0009>c");
    expect(visible("a\nb\tc\r", true)).toBe("a\nb\tc<U+000D>");
    for (const ok of ["café.é", "注意力.层", "слой", "طبقة", "a b-c_d.0"]) expect(visible(ok)).toBe(ok);
  });
});

describe("the DOM builders", () => {
  it("show text, text children, tooltips and SVG titles through visible; data attributes stay as given", () => {
    const el = h("div", { text: NAME, title: `${NAME}\n(click)`, "data-path": NAME, "aria-label": NAME });
    expect(el.textContent).toBe(SHOWN);
    expect(el.getAttribute("title")).toBe(`${SHOWN}\n(click)`);
    expect(el.getAttribute("aria-label")).toBe(SHOWN);
    expect(el.getAttribute("data-path")).toBe(NAME);
    expect(h("span", {}, "in ", NAME).textContent).toBe(`in ${SHOWN}`);
    const svg = s("g", {}, tip(NAME), s("text", { text: NAME }));
    expect(svg.textContent).toBe(SHOWN + SHOWN);
    expect(svg.querySelector("title").textContent).toBe(SHOWN);
    const label = h("span");
    setText(label, `${NAME} (x)`, NAME);
    expect(label.textContent).toBe(`${SHOWN} (x)`);
    expect(label.getAttribute("title")).toBe(SHOWN);
  });
});

describe("the explorer", () => {
  let el;
  let cleanup;
  afterEach(() => {
    cleanup?.();
    el.remove();
  });

  it("shows a selected module's name with its controls written out, and keeps the selection as given", () => {
    el = document.createElement("div");
    document.body.appendChild(el);
    const model = mockModel(state({ selected: `Net.${NAME}` }));
    cleanup = widget.render({ model, el });
    const texts = [el.textContent, ...[...el.querySelectorAll("[title]")].map((n) => n.getAttribute("title"))];
    expect(texts.join("")).toContain(`Net.${SHOWN}`);
    for (const t of texts) expect(t).not.toMatch(/[\u202a-\u202e\u2066-\u2069\u200e\u200f]/);
    expect(model.get("selected_module")).toBe(`Net.${NAME}`);
  });
});
