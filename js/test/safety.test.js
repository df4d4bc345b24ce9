// No source file may hand text to the HTML parser: everything goes through textContent and
// setAttribute (src/dom.js), so names from a trace can never become markup.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

function sources(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith(".js") ? [join(dir, e.name)] : [],
  );
}

describe("sources", () => {
  const files = sources(new URL("../src", import.meta.url).pathname);
  it.each(files)("%s never parses HTML", (file) => {
    const text = readFileSync(file, "utf8");
    expect(text).not.toMatch(/innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|createContextualFragment|\beval\(|new Function/);
  });
});

// The data colours (categories, phases, edges, tree keys) are Python's (fakeviz/_core/palette.py, sent as
// summary.palette): src/ defines none of them, so the two sides cannot drift apart again.
describe("colours", () => {
  const src = new URL("../src", import.meta.url).pathname;
  it.each(sources(src))("%s holds no colour literal", (file) => {
    expect(readFileSync(file, "utf8")).not.toMatch(/#[0-9a-f]{3,8}\b|\brgba?\(|\bhsla?\(/i);
  });
  it("explorer.css defines no data colour, only reads them", () => {
    const css = ["explorer.css", "css/base.css", "css/tables.css"]
      .map((f) => readFileSync(join(src, f), "utf8"))
      .join("\n");
    expect(css).not.toMatch(/--fv-(cat|phase|edge|key)[\w-]*\s*:/);
  });
});
