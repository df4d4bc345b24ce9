import { describe, expect, it } from "vitest";
import { readData } from "../src/data.js";
import {
  filterOps,
  lowerBound,
  moduleSpans,
  nearest,
  peakShare,
  resolveSelection,
  rowOfSeq,
  searchModules,
  searchTree,
  subtreeMask,
  textMask,
} from "../src/filter.js";
import { EVIL, MODULES, ROWS, state } from "./fixture.js";

const st = state();
const data = readData((k) => st[k]);
const { tree, ops, memory } = data;

describe("selection", () => {
  it("a folded row covers every module folded into its subtree", () => {
    const sel = resolveSelection("Net.blocks.0-1", tree, ops);
    expect(sel.kind).toBe("node");
    expect(sel.node).toBe(ROWS.indexOf("Net.blocks.0-1"));
    const covered = MODULES.filter((_, m) => sel.mask[m]);
    expect(covered).toEqual(["Net.blocks.0", "Net.blocks.0.fc", "Net.blocks.1", "Net.blocks.1.fc"]);
    expect(Array.from(subtreeMask(tree, 0)).every(Boolean)).toBe(true);
  });

  it("a module path of the trace covers that module and below, and points at its fold", () => {
    const sel = resolveSelection("Net.blocks.1", tree, ops);
    expect(sel.kind).toBe("module");
    expect(sel.node).toBe(ROWS.indexOf("Net.blocks.0-1"));
    expect(MODULES.filter((_, m) => sel.mask[m])).toEqual(["Net.blocks.1", "Net.blocks.1.fc"]);
  });

  it("an unknown or empty path selects nothing", () => {
    expect(resolveSelection("", tree, ops).mask).toBeNull();
    expect(resolveSelection("Nope", tree, ops).kind).toBe("none");
    // a prefix of a name is not a parent
    expect(resolveSelection("Net.bl", tree, ops).kind).toBe("none");
  });
});

describe("ops filtering", () => {
  it("filters by module, phase, device, op name and search together", () => {
    const blocks = resolveSelection("Net.blocks", tree, ops).mask;
    expect(Array.from(filterOps(ops, { moduleMask: blocks }))).toEqual([2, 3, 4, 5, 9, 10, 11]);
    expect(Array.from(filterOps(ops, { moduleMask: blocks, phase: 2 }))).toEqual([9, 10, 11]);
    expect(Array.from(filterOps(ops, { opMask: textMask(ops.strings.ops, "MM") }))).toEqual([2, 4, 6, 8, 9]);
    expect(Array.from(filterOps(ops, { device: 1 }))).toEqual([]);
    expect(filterOps(ops, {}).length).toBe(12);
    const search = textMask(ops.strings.modules, "script");
    expect(Array.from(filterOps(ops, { searchMask: search }))).toEqual([7]);
  });

  it("finds tree rows and module paths by text", () => {
    expect(searchTree(tree, "FC").map((r) => ROWS[r])).toEqual(["Net.blocks.0-1.fc"]);
    expect(searchModules(ops.strings.modules, "fc").map((m) => MODULES[m])).toEqual(["Net.blocks.0.fc", "Net.blocks.1.fc"]);
    expect(searchModules(ops.strings.modules, "<script>").map((m) => MODULES[m])).toEqual([`Net.${EVIL}`]);
    expect(searchTree(tree, "  ")).toEqual([]);
  });
});

describe("spans and shares", () => {
  it("merges a module's ops into seq intervals", () => {
    const fc = resolveSelection("Net.blocks.0-1.fc", tree, ops).mask;
    expect(moduleSpans(ops, fc, 1)).toEqual([[2, 6], [9, 12]]);
    // with a gap tolerance of 4 ops the two runs merge
    expect(moduleSpans(ops, fc, 4)).toEqual([[2, 12]]);
    expect(moduleSpans(ops, null)).toEqual([]);
  });

  it("adds up a selection's bytes at the peak by category", () => {
    const dev = memory.devices[0];
    const all = peakShare(dev.attr, resolveSelection("Net", tree, ops).mask, 8);
    expect(all[0]).toBe(1200);
    expect(all[2]).toBe(1200);
    const head = peakShare(dev.attr, resolveSelection("Net.head", tree, ops).mask, 8);
    expect(Array.from(head)).toEqual([400, 0, 400, 0, 0, 0, 0, 0]);
    expect(Array.from(peakShare(dev.attr, null, 8))).toEqual([0, 0, 0, 0, 0, 0, 0, 0]);
  });

  it("finds rows by seq", () => {
    const seqs = Int32Array.from([2, 5, 9, 40]);
    expect(rowOfSeq(seqs, 9)).toBe(2);
    expect(rowOfSeq(seqs, 10)).toBe(-1);
    expect(lowerBound(seqs, 10)).toBe(3);
    expect(lowerBound(seqs, 100)).toBe(4);
    expect(nearest(seqs, 7)).toBe(1);
    expect(nearest(seqs, 8)).toBe(2);
    expect(nearest(seqs, -3)).toBe(0);
    expect(nearest([], 1)).toBe(-1);
  });
});
