import { describe, expect, it } from "vitest";
import { readData } from "../src/data.js";
import { aliasLayout, ancestry, icicle, linear, linePath, stackedAreas } from "../src/layout.js";
import { ROWS, state } from "./fixture.js";

const st = state();
const data = readData((k) => st[k]);
const { tree, alias } = data;
const params = (r) => tree.figures.param_bytes[r];

describe("icicle", () => {
  it("splits a row's width among its children by value", () => {
    const boxes = icicle(tree, -1, params);
    const by = Object.fromEntries(boxes.map((b) => [ROWS[b.row], b]));
    expect(by.Net).toMatchObject({ x0: 0, x1: 1, depth: 0 });
    expect(by["Net.blocks"].x1 - by["Net.blocks"].x0).toBeCloseTo(800 / 1200);
    expect(by["Net.head"].x0).toBeCloseTo(800 / 1200);
    expect(by["Net.blocks.0-1.fc"].depth).toBe(3);
    // zero-sized rows get no box
    expect(by[ROWS[5]]).toBeUndefined();
  });

  it("drills down: the zoom root spans the width", () => {
    const boxes = icicle(tree, ROWS.indexOf("Net.blocks.0-1"), params);
    expect(boxes.map((b) => [ROWS[b.row], b.x0, b.x1, b.depth])).toEqual([
      ["Net.blocks.0-1", 0, 1, 0],
      ["Net.blocks.0-1.fc", 0, 1, 1],
    ]);
  });

  it("scales children that add up to more than their parent (tied weights) to fit", () => {
    const t = { n: 3, roots: [0], children: [[1, 2], [], []] };
    const v = [10, 8, 8];
    const boxes = icicle(t, -1, (r) => v[r]);
    expect(boxes[2].x1).toBeCloseTo(1);
    expect(boxes[1].x1 - boxes[1].x0).toBeCloseTo(0.5);
  });

  it("leaves out boxes below minWidth and rows below maxDepth", () => {
    const boxes = icicle(tree, -1, params, { maxDepth: 1 });
    expect(Math.max(...boxes.map((b) => b.depth))).toBe(1);
    expect(icicle(tree, -1, params, { minWidth: 0.5 }).map((b) => ROWS[b.row])).toEqual([
      "Net",
      "Net.blocks",
      "Net.blocks.0-1",
      "Net.blocks.0-1.fc",
    ]);
  });

  it("gives the breadcrumb trail", () => {
    expect(ancestry(tree, ROWS.indexOf("Net.blocks.0-1.fc")).map((r) => ROWS[r])).toEqual([
      "Net",
      "Net.blocks",
      "Net.blocks.0-1",
      "Net.blocks.0-1.fc",
    ]);
  });
});

describe("charts", () => {
  it("maps and inverts linearly", () => {
    const x = linear(0, 100, 10, 210);
    expect(x(50)).toBe(110);
    expect(x.invert(110)).toBe(50);
  });

  it("stacks categories bottom-up and skips empty ones", () => {
    const cats = [Float64Array.from([1, 2]), Float64Array.from([0, 0]), Float64Array.from([3, 3])];
    const y = (v) => 100 - v;
    const areas = stackedAreas([0, 10], cats, [0, 1], y);
    expect(areas.map((a) => a.cat)).toEqual([0, 2]);
    expect(areas[0].d).toBe("M0,99L10,98L10,100L0,100Z");
    expect(areas[1].d).toBe("M0,96L10,95L10,98L0,99Z");
    expect(linePath([0, 5], [7, 9], [1, 0], y)).toBe("M0,91L5,93");
  });
});

describe("alias layout", () => {
  it("puts names left, tensors by view depth, storages right, and keeps every node", () => {
    const lay = aliasLayout(alias);
    // nodes: storage 0, tensor $1, view tensor $2, two names of $1
    expect(Array.from(lay.column)).toEqual([3, 1, 2, 0, 0]);
    expect(lay.columns).toBe(4);
    const places = Array.from(lay.y, (y, i) => `${lay.column[i]}:${y}`);
    expect(new Set(places).size).toBe(5); // no two nodes on one spot
    for (const v of lay.y) expect(v).toBeGreaterThanOrEqual(0);
    expect(lay.rows).toBeGreaterThanOrEqual(3);
  });
});
