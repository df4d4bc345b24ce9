// @vitest-environment jsdom
// The live panel hides the static summary written beside it (Note: [static fallback] in fakeviz/_views/explorer.py).
import { describe, expect, it } from "vitest";
import { hideStatic } from "../src/explorer.js";

describe("static fallback", () => {
  it("hides the output holding this panel's summary, and only that one", () => {
    document.body.innerHTML = `
      <div class="jp-OutputArea">
        <div class="jp-OutputArea-child" id="mine"><div class="fv-static" data-fv-static="fv-1">summary</div></div>
        <div class="jp-OutputArea-child" id="other"><div class="fv-static" data-fv-static="fv-2">other</div></div>
      </div>
      <div class="fv-static" data-fv-static="fv-1" id="bare">outside an output area</div>`;
    expect(hideStatic("fv-1")).toBe(2);
    expect(document.getElementById("mine").style.display).toBe("none");
    expect(document.getElementById("bare").style.display).toBe("none");
    expect(document.getElementById("other").style.display).toBe("");
    expect(hideStatic("")).toBe(0);
  });
});

import { plainName } from "../src/format.js";

describe("module names with bidi controls", () => {
  it("writes each control out, so the name keeps its logical order", () => {
    expect(plainName("model.\u202eattn.q")).toBe("model.<U+202E>attn.q");
    expect(plainName("a\u200fb\u2066c\u2069")).toBe("a<U+200F>b<U+2066>c<U+2069>");
    expect(plainName("layers.0.mlp")).toBe("layers.0.mlp");
  });
});
