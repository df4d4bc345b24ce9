// @vitest-environment jsdom
// Render smoke test: the anywidget entry point in a DOM, with a stand-in model.
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import widget from "../src/explorer.js";
import { fmtSeconds } from "../src/format.js";
import { CATEGORIES, END, EST, EVIL, PALETTE, PHASES, aliasPack, mockModel, state, timePack, toDataView } from "./fixture.js";

let el;
let model;
let cleanup;

beforeEach(() => {
  el = document.createElement("div");
  document.body.appendChild(el);
  model = mockModel(state());
  cleanup = widget.render({ model, el });
});

afterEach(() => {
  cleanup?.();
  el.remove();
});

const q = (sel) => el.querySelector(sel);
const qa = (sel) => [...el.querySelectorAll(sel)];
const node = (path) => qa(".fv-tree .fv-node").find((n) => n.getAttribute("data-path") === path);

describe("explorer render", () => {
  it("renders every panel", () => {
    for (const sel of [".fv-tree", ".fv-bars", ".fv-timeline", ".fv-alias", ".fv-ops"]) expect(q(sel)).not.toBeNull();
    expect(qa(".fv-tree .fv-node").length).toBe(5); // the zero-parameter module has no box
    expect(qa(".fv-bars .fv-bar-seg").length).toBe(2); // Parameter and Gradient at the peak
    expect(qa(".fv-timeline .fv-area").length).toBe(3);
    expect(q(".fv-timeline .fv-capacity")).not.toBeNull();
    expect(q('[data-testid="fv-peak"]')).not.toBeNull();
    expect(qa(".fv-timeline .fv-phase").map((r) => r.getAttribute("data-phase"))).toEqual(["init", "forward", "backward"]);
    expect(qa(".fv-alias .fv-anode").length).toBe(5);
    expect(qa(".fv-ops .fv-ops-sizer .fv-op-row").length).toBe(12);
    expect(q('[data-testid="fv-ops-count"]').textContent).toBe("12 of 12 ops");
    expect(q('[data-testid="fv-verdict"]').textContent).toMatch(/does not fit/);
    // one device: the verdict above names the bytes it judged; the headroom beside the bar is capacity - judged
    expect(q(".fv-headroom").textContent).toBe("over by 4.0 MiB");
    expect(qa(".fv-selected").length).toBe(0);
    expect(qa(".fv-highlight").length).toBe(0);
  });

  it("a click on a module selects it, filters the ops and highlights its span and share", () => {
    node("Net.blocks").click();
    expect(node("Net.blocks").classList.contains("fv-selected")).toBe(true);
    expect(model.get("selected_module")).toBe("Net.blocks");
    expect(model.saved.at(-1)).toEqual({ selected_module: "Net.blocks" });
    // ops table: only the blocks' ops
    const seqs = qa(".fv-ops-sizer .fv-op-row").map((r) => Number(r.getAttribute("data-seq")));
    expect(seqs).toEqual([2, 3, 4, 5, 9, 10, 11]);
    // timeline: the op spans [2, 6) and [9, 12)
    expect(qa(".fv-timeline .fv-span.fv-highlight").length).toBe(2);
    // bars: the blocks' share of the peak (800 params + 800 grads)
    expect(q('[data-testid="fv-bar-share"]').classList.contains("fv-highlight")).toBe(true);
    expect(q(".fv-share-text").textContent).toContain("1.6 KiB of this peak (66.7 %)");
    // alias graph: only the head's nodes, none of them in blocks
    expect(qa(".fv-alias .fv-anode.fv-highlight").length).toBe(0);
    // drilled down: the breadcrumb shows the path, the blocks span the width
    expect(qa(".fv-breadcrumb .fv-crumb").map((b) => b.textContent)).toEqual(["all", "Net", "blocks"]);
    expect(node("Net.blocks").style.width).toBe("100%");
  });

  it("follows selection, device and phase set from the kernel", () => {
    model.kernelSet("selected_module", "Net.head");
    expect(node("Net.head").classList.contains("fv-selected")).toBe(true);
    expect(qa(".fv-alias .fv-anode.fv-highlight").length).toBe(4);
    model.kernelSet("phase", "backward");
    expect(q(".fv-timeline rect.fv-phase-backward").classList.contains("fv-phase-active")).toBe(true);
    expect(qa(".fv-ops-sizer .fv-op-row").map((r) => Number(r.getAttribute("data-seq")))).toEqual([8]);
    expect(q("select.fv-phase").value).toBe("backward");
    model.kernelSet("device", "cpu");
    expect(q(".fv-bars .fv-empty").textContent).toBe("no memory on cpu");
    // the kernel's own changes are not echoed back
    expect(model.saved).toEqual([]);
  });

  it("a module path inside a fold selects that module only", () => {
    model.kernelSet("selected_module", "Net.blocks.1");
    const seqs = qa(".fv-ops-sizer .fv-op-row").map((r) => Number(r.getAttribute("data-seq")));
    expect(seqs).toEqual([4, 5, 9]);
    expect(node("Net.blocks.0-1").classList.contains("fv-selected")).toBe(true);
    expect(q('[data-testid="fv-tree-detail"]').textContent).toContain("one of the modules folded into Net.blocks.0-1");
  });

  it("renders markup in names as text", () => {
    const search = q('[data-testid="fv-search"]');
    search.focus();
    search.value = "script";
    search.dispatchEvent(new Event("input"));
    expect(model.get("search")).toBe("script");
    const hits = qa(".fv-search-hit");
    expect(hits.length).toBeGreaterThan(0);
    expect(hits[0].getAttribute("data-path")).toBe(`Net.${EVIL}`);
    hits[0].click();
    expect(model.get("selected_module")).toBe(`Net.${EVIL}`);
    expect(el.querySelector("script")).toBeNull();
    expect(el.textContent).toContain(EVIL);
    expect(qa(".fv-ops-sizer .fv-op-row").map((r) => r.querySelector(".fv-c-module").textContent)).toEqual([`Net.${EVIL}`]);
  });

  it("selectors and the ops filter update the model and the table", () => {
    const phase = q("select.fv-phase");
    phase.value = "forward";
    phase.dispatchEvent(new Event("change"));
    expect(model.get("phase")).toBe("forward");
    const filter = q('[data-testid="fv-op-filter"]');
    filter.value = "relu";
    filter.dispatchEvent(new Event("input"));
    expect(qa(".fv-ops-sizer .fv-op-row").map((r) => Number(r.getAttribute("data-seq")))).toEqual([3, 5]);
    q(".fv-ops-sizer .fv-op-row").click();
    expect(q(".fv-timeline .fv-cursor").getAttribute("visibility")).toBe("visible");
    expect(q(".fv-ops-sizer .fv-op-row").classList.contains("fv-current")).toBe(true);
  });

  it("renders a widget without data (Explorer() before set_state)", () => {
    const empty = mockModel({ summary: {}, tree: new DataView(new ArrayBuffer(0)), memory: null, ops: null, alias: null, selected_module: "", device: "", phase: "", search: "", size_by: "param_bytes" });
    const host = document.createElement("div");
    const done = widget.render({ model: empty, el: host });
    expect(host.querySelector(".fv-tree .fv-empty").textContent).toBe("no modules were called in this run");
    expect(host.querySelector(".fv-timeline .fv-empty").textContent).toBe("no memory was used");
    expect(host.querySelector('[data-testid="fv-ops-count"]').textContent).toBe("0 of 0 ops");
    expect(host.querySelector(".fv-error")).toBeNull();
    done();
  });

  it("shows an error instead of throwing on a damaged pack", () => {
    const bad = mockModel({ ...state(), tree: new DataView(new TextEncoder().encode("nonsense").buffer) });
    const host = document.createElement("div");
    const logged = vi.spyOn(console, "error").mockImplementation(() => {});
    const done = widget.render({ model: bad, el: host });
    expect(host.querySelector(".fv-error").textContent).toContain("bad magic");
    expect(logged).toHaveBeenCalledOnce();
    logged.mockRestore();
    done();
  });

  it("re-renders once when the kernel sends new data, keeping the selection", async () => {
    model.kernelSet("selected_module", "Net.head");
    const fresh = state();
    for (const k of ["tree", "memory", "ops", "alias"]) model.kernelSet(k, fresh[k]);
    await Promise.resolve();
    expect(node("Net.head").classList.contains("fv-selected")).toBe(true);
    expect(qa(".fv-tree").length).toBe(1);
  });

  it("redraws only the alias graph when the kernel sends a new neighbourhood", async () => {
    node("Net.blocks").click();
    const treeNode = node("Net.blocks");
    const before = qa(".fv-alias .fv-anode").length;
    // the kernel's answer to the selection: a graph of one storage and one tensor of the blocks
    const fresh = aliasPack({ around: "Net.blocks (1 storages)", module: 1 });
    model.kernelSet("alias", fresh);
    await Promise.resolve();
    expect(node("Net.blocks")).toBe(treeNode); // the rest of the panel was not rebuilt
    expect(treeNode.classList.contains("fv-selected")).toBe(true);
    const nodes = qa(".fv-alias .fv-anode");
    expect(nodes.length).not.toBe(before);
    expect(nodes.length).toBe(2);
    expect(q('[data-testid="fv-alias-info"]').textContent).toContain("around Net.blocks (1 storages)");
    // both nodes belong to the selected module: highlighted at once
    expect(qa(".fv-alias .fv-anode.fv-highlight").length).toBe(2);
  });

  it("draws edges from the end of a tensor's label, never across it", () => {
    const label = q('.fv-alias .fv-anode-tensor[data-node="1"] text');
    const edge = qa(".fv-alias path.fv-edge-storage")[0];
    const x0 = Number(label.parentNode.getAttribute("transform").match(/translate\(([\d.]+)/)[1]);
    const labelEnd = x0 + Number(label.getAttribute("x")) + label.textContent.length * 6;
    expect(Number(edge.getAttribute("d").match(/^M([\d.]+)/)[1])).toBeGreaterThanOrEqual(labelEnd);
  });

  it("colours the tree by the device or dtype holding most parameters, with a legend", () => {
    expect(qa(".fv-tree .fv-node.fv-keyed").length).toBe(0);
    expect(q('[data-testid="fv-color-legend"]').hidden).toBe(true);
    const select = q('[data-testid="fv-color-by"]');
    select.value = "device";
    select.dispatchEvent(new Event("change"));
    expect(node("Net.head").getAttribute("data-color")).toBe("cpu");
    expect(node("Net.blocks").getAttribute("data-color")).toBe("cuda:0");
    expect(node("Net.blocks").classList.contains("fv-key-0")).toBe(true);
    expect(node("Net.head").classList.contains("fv-key-1")).toBe(true);
    const legend = q('[data-testid="fv-color-legend"]');
    expect(legend.hidden).toBe(false);
    expect([...legend.querySelectorAll("li")].map((li) => li.textContent)).toEqual(["cuda:0", "cpu", "no parameters"]);
    expect(node("Net.head").title).toContain("device: cpu");
    select.value = "dtype";
    select.dispatchEvent(new Event("change"));
    expect(node("Net.head").getAttribute("data-color")).toBe("float32");
    select.value = "";
    select.dispatchEvent(new Event("change"));
    expect(qa(".fv-tree .fv-node.fv-keyed").length).toBe(0);
  });

  it("names the precision of each row's weights, and colours the tree by it", () => {
    expect(node("Net.blocks").title).toContain("\nweights: nf4 + LoRA bf16\n");
    expect(node("Net.head").title).toContain("\nweights: bf16\n");
    model.kernelSet("selected_module", "Net.head");
    const detail = () => [...q('[data-testid="fv-tree-detail"]').querySelectorAll("dt")].map((dt) => [dt.textContent, dt.nextSibling.textContent]);
    expect(detail()).toContainEqual(["weights", "bf16"]);
    model.kernelSet("selected_module", `Net.${EVIL}`);
    expect(detail()).toContainEqual(["weights", "none"]);
    const select = q('[data-testid="fv-color-by"]');
    expect([...select.options].map((o) => o.value)).toEqual(["", "device", "dtype", "precision"]);
    select.value = "precision";
    select.dispatchEvent(new Event("change"));
    expect(node("Net.blocks").getAttribute("data-color")).toBe("nf4 + LoRA bf16");
    expect(node("Net.head").getAttribute("data-color")).toBe("bf16");
    expect(node("Net.head").style.getPropertyValue("--fv-key")).toBe(PALETTE.tree.precision[2]);
    expect(node("Net.head").title).toContain("precision: bf16");
    expect(node("Net.head").title).not.toContain("weights:"); // said once, by the colour key
    const legend = [...q('[data-testid="fv-color-legend"]').querySelectorAll("li")].map((li) => li.textContent);
    expect(legend).toEqual(["mixed", "nf4 + LoRA bf16", "bf16", "no parameters"]);
  });

  it("reads a payload written before precisions existed", () => {
    const other = document.createElement("div");
    document.body.appendChild(other);
    const done = widget.render({ model: mockModel(state({ precision: false })), el: other });
    try {
      const head = [...other.querySelectorAll(".fv-tree .fv-node")].find((n) => n.getAttribute("data-path") === "Net.head");
      expect(head.title).not.toContain("weights:");
      const select = other.querySelector('[data-testid="fv-color-by"]');
      select.value = "precision";
      select.dispatchEvent(new Event("change"));
      expect(other.querySelectorAll(".fv-tree .fv-node.fv-keyed").length).toBe(0);
    } finally {
      done?.();
      other.remove();
    }
  });

  it("draws with the colours Python sent (summary.palette), none of its own", () => {
    const root = q(".fv-root");
    const prop = (name) => root.style.getPropertyValue(name);
    CATEGORIES.forEach((_, i) => expect(prop(`--fv-cat-${i}`)).toBe(PALETTE.categories[i]));
    PHASES.forEach((p, i) => expect(prop(`--fv-phase-${p}`)).toBe(PALETTE.phases[i]));
    for (const [kind, color] of Object.entries(PALETTE.edges)) expect(prop(`--fv-edge-${kind}`)).toBe(color);
    // each bar segment and legend swatch is drawn in its category's colour (.fv-cat-<index> reads --fv-cat-<index>)
    for (const seg of qa(".fv-bars .fv-bar-seg")) {
      expect(seg.classList.contains(`fv-cat-${CATEGORIES.indexOf(seg.getAttribute("data-category"))}`)).toBe(true);
    }
    expect(qa(".fv-bars .fv-bar-seg").map((r) => r.getAttribute("data-category"))).toEqual(["Parameter", "Gradient"]);
    // the tree's keys take the colours of the plotly layer tree
    const select = q('[data-testid="fv-color-by"]');
    select.value = "device";
    select.dispatchEvent(new Event("change"));
    expect(node("Net.blocks").style.getPropertyValue("--fv-key")).toBe(PALETTE.tree.device[0]);
    expect(node("Net.head").style.getPropertyValue("--fv-key")).toBe(PALETTE.tree.device[1]);
    const swatches = qa('[data-testid="fv-color-legend"] .fv-swatch').map((e) => e.style.getPropertyValue("--fv-key"));
    expect(swatches).toEqual(PALETTE.tree.device);
  });

  it("switches the timeline's x axis to the estimated time, both ways", () => {
    const select = q('[data-testid="fv-x-axis"]');
    expect(select.hidden).toBe(false);
    expect([...select.options].map((o) => [o.value, o.textContent])).toEqual([["op", "x: op index"], ["time", "x: estimated time on H100"]]);
    expect(select.value).toBe("op");
    // the step, not the set-up before it, and which step it is (Note: [one step] in fakeviz/_analysis/timing.py)
    expect(q('[data-testid="fv-step-time"]').textContent).toBe(
      `estimated step ${fmtSeconds(END.at(-1) - END[1])} on H100 (gpu bound); timed: the training step (ops 2 to 11, after the set-up)`,
    );
    const ticks = () => qa(".fv-timeline .fv-tick").map((t) => t.textContent);
    const areas = () => qa(".fv-timeline .fv-area").map((a) => a.getAttribute("d"));
    expect(ticks()).toEqual(["op 0", "op 6", "op 11"]);
    const byOp = areas();
    select.value = "time";
    select.dispatchEvent(new Event("change"));
    expect(model.get("x_axis")).toBe("time");
    expect(model.saved.at(-1)).toEqual({ x_axis: "time" });
    const end = Math.fround(END.at(-1));
    expect(ticks()).toEqual(["0 s", fmtSeconds(end / 2), fmtSeconds(end)]);
    expect(q(".fv-tl-title").textContent).toContain("x: estimated time on H100");
    expect(q(".fv-peak-label").textContent).toBe(`peak 2.3 KiB at op 10, ${fmtSeconds(Math.fround(END[10]))}`);
    // the same points, placed at each op's end: op 10 (the peak) at END[10] of the step
    expect(areas().length).toBe(byOp.length);
    expect(areas()).not.toEqual(byOp);
    const peakX = Number(q(".fv-peak-line").getAttribute("x1"));
    const span = Number(q(".fv-overlay").getAttribute("width"));
    const left = Number(q(".fv-overlay").getAttribute("x"));
    expect((peakX - left) / span).toBeCloseTo(Math.fround(END[10]) / end, 2);
    // phases span their ops' time: the backward starts when op 7 ends
    const backward = q(".fv-timeline rect.fv-phase-backward");
    expect((Number(backward.getAttribute("x")) - left) / span).toBeCloseTo(Math.fround(END[7]) / end, 2);
    // the kernel moves it back
    model.kernelSet("x_axis", "op");
    expect(ticks()).toEqual(["op 0", "op 6", "op 11"]);
    expect(select.value).toBe("op");
    expect(model.saved.length).toBe(1);
  });

  it("hovering an op shows its estimated time and bound", () => {
    const overlay = q(".fv-timeline .fv-overlay");
    const svg = q(".fv-timeline-svg");
    svg.getBoundingClientRect = () => ({ left: 0, top: 0, width: Number(svg.getAttribute("width")), height: 240 });
    const hoverOp = (seq) => {
      // the middle of op `seq` on the op axis: its pixel is x(seq + 0.5)
      const left = Number(overlay.getAttribute("x"));
      const span = Number(overlay.getAttribute("width"));
      overlay.dispatchEvent(new MouseEvent("mousemove", { clientX: left + ((seq + 0.5) / 12) * span, bubbles: true }));
      return qa('[data-testid="fv-tooltip"] div').map((d) => d.textContent);
    };
    let lines = hoverOp(2);
    expect(lines[0]).toBe("op 2 · forward");
    expect(lines).toContain(`est 4.00 ms · compute bound · gemm, ends at ${fmtSeconds(Math.fround(END[2]))} on H100`);
    lines = hoverOp(7);
    expect(lines).toContain(`est 10.0 µs · latency bound · reduction, ends at ${fmtSeconds(Math.fround(END[7]))} on H100`);
    lines = hoverOp(0);
    expect(lines).toContain(`no kernel (view or metadata): takes no time, ends at 12.0 µs on H100`);
  });

  it("redraws the time axis when the kernel estimates on another GPU, and has no switch without times", async () => {
    model.kernelSet("x_axis", "time");
    const slower = END.map((t) => t * 3);
    model.kernelSet("time", toDataView(timePack({ gpu: "A100", end: slower, est: EST.map((t) => t * 3) })));
    const select = q('[data-testid="fv-x-axis"]');
    expect([...select.options].map((o) => o.textContent)).toContain("x: estimated time on A100");
    expect(select.value).toBe("time");
    expect(qa(".fv-timeline .fv-tick").at(-1).textContent).toBe(fmtSeconds(Math.fround(slower.at(-1))));
    expect(q('[data-testid="fv-step-time"]').textContent).toContain("on A100");
    // no times (gpu=False in Python): no switch, and the op axis even when x_axis says time
    model.kernelSet("time", new DataView(new ArrayBuffer(0)));
    expect(select.hidden).toBe(true);
    expect(q('[data-testid="fv-step-time"]').hidden).toBe(true);
    expect(qa(".fv-timeline .fv-tick").map((t) => t.textContent)).toEqual(["op 0", "op 6", "op 11"]);
  });

  it("cleans up: listeners off, DOM gone", () => {
    expect(model.listenerCount()).toBeGreaterThan(0);
    cleanup();
    cleanup = null;
    expect(model.listenerCount()).toBe(0);
    expect(el.childElementCount).toBe(0);
  });
});
