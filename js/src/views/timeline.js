// The memory timeline of each device: stacked areas by category over the op sequence or the estimated time
// (the x-axis control; data.time, fakeviz._views.payload.time_pack), phases shaded, the peak marked, the caching
// allocator's allocated/reserved curves, the capacity line, the selected module's op spans highlighted; hover
// shows the op, module, line and the op's estimated time and bound.
import { minmaxByColumn } from "../decimate.js";
import { h, s, setText, tip, toggle, watchWidth, widthOf } from "../dom.js";
import { moduleSpans, nearest, rowOfSeq } from "../filter.js";
import { capacityOf, fmtBytes, fmtInt, fmtSeconds, shortLine } from "../format.js";
import { linePath, linear, stackedAreas, timeAxis } from "../layout.js";

const DEFAULT_W = 1000;
const H = 240;
const PAD = { l: 70, r: 12, t: 16, b: 22 };

export function timelineView(ctx) {
  const { data, store } = ctx;
  const { summary, memory, ops } = data;
  const body = h("div", { class: "fv-timeline-body" });
  // the x axis: op index, or each op at its estimated end on the time pack's GPU (only with a time pack)
  const xAxis = h("select", { class: "fv-x-axis", "data-testid": "fv-x-axis", "aria-label": "timeline x axis" });
  xAxis.addEventListener("change", () => store.set({ xAxis: xAxis.value }));
  const stepNote = h("span", { class: "fv-hint fv-step-time", "data-testid": "fv-step-time" });
  const legend = h(
    "ul",
    { class: "fv-legend fv-phase-legend" },
    summary.phases.map((p) => h("li", {}, h("span", { class: `fv-swatch fv-phase-${p}` }), p)),
  );
  const el = h(
    "section",
    { class: "fv-panel fv-timeline", "data-testid": "fv-timeline" },
    h("div", { class: "fv-panel-head" }, h("h3", { text: "Memory over the run" }), h("span", { class: "fv-hint", text: "hover for the op, click to find it in the table" }), xAxis, stepNote),
    legend,
    body,
  );
  let charts = [];
  let W = DEFAULT_W; // drawn at the body's real width: text is never scaled

  const timed = () => (store.get().xAxis === "time" && ctx.data.time && ctx.data.time.n === memory.nOps ? ctx.data.time : null);

  function renderHead() {
    const time = ctx.data.time;
    xAxis.hidden = !time;
    stepNote.hidden = !time;
    if (!time) return;
    xAxis.replaceChildren(
      h("option", { value: "op", text: "x: op index" }),
      h("option", { value: "time", text: `x: estimated time on ${time.gpu}` }),
    );
    xAxis.value = timed() ? "time" : "op";
    // one step, never the set-up (Note: [one step] in fakeviz/_analysis/timing.py): `timed` says which
    setText(stepNote, `estimated step ${fmtSeconds(time.stepS)} on ${time.gpu} (${time.bound} bound)${time.timed ? `; timed: ${time.timed}` : ""}`,
      "fakeviz's time model (Trace.step_time): an estimate from the record's FLOPs and bytes, not a measurement");
  }

  function chart(dev) {
    const pk = summary.peaks[dev.device];
    const nOps = Math.max(1, memory.nOps);
    const time = timed();
    // x(v): a fractional op index (an op's boundaries) to a pixel; at(seq): where the op's point is drawn
    const x = time ? timeAxis(time.edge, PAD.l, W - PAD.r) : linear(0, nOps, PAD.l, W - PAD.r);
    const at = time ? (q) => x(q + 1) : (q) => x(q + 0.5);
    let top = 0;
    for (let i = 0; i < dev.total.length; i++) top = Math.max(top, dev.total[i], dev.reserved ? dev.reserved[i] : 0);
    // the capacity sets the scale unless it would flatten the curve (3x above the highest point)
    const capacity = capacityOf(summary, dev.device);
    const capacityOnChart = capacity != null && capacity <= 3 * top;
    if (capacityOnChart) top = Math.max(top, capacity);
    top = top * 1.05 || 1;
    const y = linear(0, top, H - PAD.b, PAD.t);
    const peakIdx = nearest(dev.seq, dev.peakSeq);
    const idx = time
      ? minmaxByColumn(Float64Array.from(dev.seq, at), dev.total, PAD.l, W - PAD.r, W - PAD.l - PAD.r, [peakIdx])
      : minmaxByColumn(dev.seq, dev.total, 0, nOps, W - PAD.l - PAD.r, [peakIdx]);
    const xs = Array.from(idx, (i) => at(dev.seq[i]));

    const svg = s("svg", { class: "fv-timeline-svg", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `memory of ${dev.device} over the run` });
    const phases = s("g", { class: "fv-phases" });
    const runs = memory.phaseRuns;
    for (let k = 0; k < (runs.phase?.length ?? 0); k++) {
      const name = memory.phases[runs.phase[k]];
      const r = s("rect", {
        class: `fv-phase fv-phase-${name}`,
        "data-phase": name,
        x: x(runs.start[k]),
        y: PAD.t,
        width: Math.max(0.5, x(runs.stop[k]) - x(runs.start[k])),
        height: H - PAD.t - PAD.b,
      });
      const when = time ? `, ${fmtSeconds(time.edge[runs.start[k]])}–${fmtSeconds(time.edge[runs.stop[k]])}` : "";
      r.appendChild(tip(`${name}: ops ${fmtInt(runs.start[k])}–${fmtInt(runs.stop[k] - 1)}${when}`));
      phases.appendChild(r);
    }
    const spans = s("g", { class: "fv-spans" });
    const areas = s("g", { class: "fv-areas" });
    for (const a of stackedAreas(xs, dev.cats, idx, y)) {
      areas.appendChild(s("path", { class: `fv-area fv-cat-${a.cat}`, d: a.d }, tip(memory.categories[a.cat])));
    }
    const lines = s("g", { class: "fv-lines" });
    if (dev.reserved) {
      lines.appendChild(s("path", { class: "fv-line-reserved", d: linePath(xs, dev.reserved, idx, y) }, tip("reserved (caching allocator model)")));
      lines.appendChild(s("path", { class: "fv-line-allocated", d: linePath(xs, dev.allocated, idx, y) }, tip("allocated (caching allocator model)")));
    }
    const marks = s("g", { class: "fv-marks" });
    if (capacity != null) {
      const label = `capacity ${summary.capacitySpec ?? ""} ${fmtBytes(capacity)}`;
      if (capacityOnChart) {
        const yc = y(capacity);
        marks.appendChild(s("line", { class: "fv-capacity", x1: PAD.l, x2: W - PAD.r, y1: yc, y2: yc }));
        marks.appendChild(s("text", { class: "fv-capacity-label", x: W - PAD.r - 4, y: yc - 4, "text-anchor": "end", text: label }));
      } else {
        marks.appendChild(s("text", { class: "fv-capacity-label", x: W - PAD.r - 4, y: PAD.t - 4, "text-anchor": "end", text: `${label} (far above the chart)` }));
      }
    }
    if (pk) {
      const xp = at(pk.seq);
      const yp = y(pk.bytes);
      const g = s("g", { class: "fv-peak", "data-testid": "fv-peak" });
      g.appendChild(s("line", { class: "fv-peak-line", x1: xp, x2: xp, y1: PAD.t, y2: H - PAD.b }));
      g.appendChild(s("circle", { class: "fv-peak-dot", cx: xp, cy: yp, r: 4 }));
      const anchor = xp > W * 0.6 ? "end" : "start";
      g.appendChild(s("text", { class: "fv-peak-label", x: anchor === "end" ? xp - 6 : xp + 6, y: Math.max(PAD.t + 10, yp - 6), "text-anchor": anchor, text: `peak ${fmtBytes(pk.bytes)} at op ${fmtInt(pk.seq)}${time ? `, ${fmtSeconds(time.end[pk.seq])}` : ""}` }));
      g.appendChild(tip(`peak ${fmtBytes(pk.bytes)} at op ${pk.seq}: ${pk.op} (${pk.module || "top level"})`));
      marks.appendChild(g);
    }
    const axis = s("g", { class: "fv-axis" });
    for (const f of [0, 0.5, 1]) {
      const v = (top / 1.05) * f;
      axis.appendChild(s("text", { x: PAD.l - 6, y: y(v) + 4, "text-anchor": "end", text: fmtBytes(v) }));
      axis.appendChild(s("line", { class: "fv-grid-line", x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v) }));
    }
    // first, middle and last op, each named once (a one-op run has one tick, "op 0", under its op); on the time
    // axis the start, the middle and the end of the step
    const last = Math.max(0, memory.nOps - 1);
    const ticks = time ? [] : [...new Set([0, Math.round(last / 2), last])];
    if (time) {
      const end = time.edge[time.n];
      for (const [t, anchor] of [[0, "start"], [end / 2, "middle"], [end, "end"]]) {
        axis.appendChild(s("text", { class: "fv-tick", x: x.time(t), y: H - 6, "text-anchor": anchor, text: fmtSeconds(t) }));
      }
    }
    for (const v of ticks) {
      const alone = ticks.length === 1;
      const anchor = alone ? "middle" : v === 0 ? "start" : v === last ? "end" : "middle";
      const px = alone ? x(v + 0.5) : v === 0 ? x(0) : v === last ? x(nOps) : x(v + 0.5);
      axis.appendChild(s("text", { class: "fv-tick", x: px, y: H - 6, "text-anchor": anchor, text: `op ${fmtInt(v)}` }));
    }
    const cursor = s("line", { class: "fv-cursor", x1: 0, x2: 0, y1: PAD.t, y2: H - PAD.b, visibility: "hidden" });
    const hover = s("line", { class: "fv-hover-line", x1: 0, x2: 0, y1: PAD.t, y2: H - PAD.b, visibility: "hidden" });
    const overlay = s("rect", { class: "fv-overlay", x: PAD.l, y: PAD.t, width: W - PAD.l - PAD.r, height: H - PAD.t - PAD.b });
    // the selection's spans go over the areas (translucent), with a solid strip under the axis
    // so that even a one-op span shows
    svg.append(phases, axis, areas, spans, lines, marks, cursor, hover, overlay);

    const tooltip = h("div", { class: "fv-tooltip", "data-testid": "fv-tooltip", hidden: true });
    const wrap = h(
      "div",
      { class: "fv-tl-device", "data-device": dev.device },
      h("div", { class: "fv-tl-title", text: `${dev.device}${dev.reserved ? " — dashed: allocated / reserved (caching allocator model)" : ""}${time ? ` — x: estimated time on ${time.gpu}` : ""}` }),
      svg,
      tooltip,
    );

    const seqAt = (ev) => {
      const box = svg.getBoundingClientRect();
      const sx = box.width ? ((ev.clientX - box.left) / box.width) * W : 0;
      return Math.min(nOps - 1, Math.max(0, Math.floor(x.invert(sx))));
    };
    const showHover = (ev) => {
      const seq = seqAt(ev);
      const xv = at(seq);
      hover.setAttribute("x1", xv);
      hover.setAttribute("x2", xv);
      hover.setAttribute("visibility", "visible");
      const p = nearest(dev.seq, seq);
      const lines = [];
      const row = rowOfSeq(ops.seq, seq);
      if (row >= 0) {
        lines.push([`op ${fmtInt(seq)} · ${summary.phases[ops.phase[row]] ?? ""}`, "fv-tt-head"]);
        lines.push([ops.strings.ops[ops.op[row]] ?? "", "fv-tt-op"]);
        lines.push([ops.module[row] >= 0 ? ops.strings.modules[ops.module[row]] : "top level", "fv-tt-module"]);
        if (ops.line[row] >= 0) lines.push([shortLine(ops.strings.lines[ops.line[row]]), "fv-tt-line"]);
      } else {
        lines.push([`op ${fmtInt(seq)}`, "fv-tt-head"]);
      }
      const tm = ctx.data.time;
      if (tm && seq < tm.n) lines.push([opTime(tm, seq), "fv-tt-time"]);
      if (p >= 0) {
        const at = dev.seq[p] === seq ? "" : ` (nearest point: op ${fmtInt(dev.seq[p])})`;
        lines.push([`live ${fmtBytes(dev.total[p])}${at}`, "fv-tt-mem"]);
        dev.cats.forEach((col, c) => {
          if (col[p] > 0) lines.push([`${memory.categories[c]}: ${fmtBytes(col[p])}`, `fv-tt-cat fv-cat-text-${c}`]);
        });
        if (dev.reserved) lines.push([`allocated ${fmtBytes(dev.allocated[p])}, reserved ${fmtBytes(dev.reserved[p])}`, "fv-tt-mem"]);
      }
      tooltip.replaceChildren(...lines.map(([text, cls]) => h("div", { class: cls, text })));
      const box = svg.getBoundingClientRect();
      const left = box.width ? ev.clientX - box.left : 0;
      tooltip.style.left = `${Math.round(left > box.width / 2 ? left - 12 : left + 12)}px`;
      tooltip.style.transform = left > box.width / 2 ? "translateX(-100%)" : "";
      tooltip.hidden = false;
    };
    overlay.addEventListener("mousemove", showHover);
    overlay.addEventListener("mouseleave", () => {
      hover.setAttribute("visibility", "hidden");
      tooltip.hidden = true;
    });
    overlay.addEventListener("click", (ev) => store.set({ cursor: seqAt(ev) }));

    return {
      el: wrap,
      spans(spanList) {
        spans.replaceChildren(
          ...spanList.flatMap(([a, b]) => {
            const w = Math.max(1, x(b) - x(a));
            return [
              s("rect", { class: "fv-span fv-highlight", x: x(a), y: PAD.t, width: w, height: H - PAD.t - PAD.b }),
              s("rect", { class: "fv-span-strip", x: x(a), y: H - PAD.b + 1, width: Math.max(2, w), height: 4 }),
            ];
          }),
        );
      },
      phase(name) {
        for (const r of phases.children) toggle(r, "fv-phase-active", name && r.getAttribute("data-phase") === name);
        toggle(phases, "fv-phase-filtered", Boolean(name));
      },
      cursor(seq) {
        if (seq < 0) return cursor.setAttribute("visibility", "hidden");
        cursor.setAttribute("x1", at(seq));
        cursor.setAttribute("x2", at(seq));
        cursor.setAttribute("visibility", "visible");
      },
    };
  }

  function renderCharts() {
    const st = store.get();
    W = widthOf(body, W);
    const devs = memory.devices.filter((d) => !st.device || d.device === st.device);
    charts = devs.map(chart);
    body.replaceChildren(
      ...(charts.length ? charts.map((c) => c.el) : [h("p", { class: "fv-empty", text: st.device ? `no memory on ${st.device}` : "no memory was used" })]),
    );
  }

  function renderSpans() {
    const sel = ctx.derived.selection;
    // merge runs closer than one pixel: never more rectangles than the chart is wide
    const gap = Math.max(1, Math.floor(memory.nOps / (W - PAD.l - PAD.r)));
    const list = sel.mask ? moduleSpans(ops, sel.mask, gap) : [];
    for (const c of charts) c.spans(list);
    toggle(el, "fv-has-selection", list.length > 0);
  }

  function update(changed) {
    const all = !changed;
    const st = store.get();
    const redraw = all || changed.has("device") || changed.has("xAxis") || changed.has("time");
    if (all || changed.has("xAxis") || changed.has("time")) renderHead();
    if (redraw) renderCharts();
    if (redraw || changed.has("selected")) renderSpans();
    if (redraw || changed.has("phase")) for (const c of charts) c.phase(st.phase);
    if (redraw || changed.has("cursor")) for (const c of charts) c.cursor(st.cursor);
  }
  // a new width draws everything again
  const unwatch = watchWidth(body, (w) => {
    if (w !== W) update(null);
  });

  return { el, destroy: unwatch, update };
}

/** The hover's line on an op's estimated time: its own time, kernel class and bound, and its end on the step. */
export function opTime(time, seq) {
  const cls = time.cls(seq);
  const end = `ends at ${fmtSeconds(time.end[seq])} on ${time.gpu}`;
  if (cls === "none") return `no kernel (view or metadata): takes no time, ${end}`;
  if (cls === "collective") return `collective: ${fmtSeconds(time.est[seq])} on its own stream, ${end}`;
  return `est ${fmtSeconds(time.est[seq])} · ${time.boundOf(seq)} bound · ${cls}, ${end}`;
}
