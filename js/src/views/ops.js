// The ops table, virtualised: only the rows in view exist in the DOM. Filtered by the selected
// module, the search, the phase and device selectors and an op-name filter.
import { h, setText, toggle } from "../dom.js";
import { filterOps, lowerBound, textMask } from "../filter.js";
import { fmtBytes, fmtFlops, fmtInt, fmtTensor, shortLine } from "../format.js";

export const ROW_H = 22;
const VIEW_H = 330;
const OVERSCAN = 8;
const COLUMNS = ["seq", "phase", "op", "module", "output", "bytes", "FLOPs", "line"];

export function opsView(ctx) {
  const { data, store } = ctx;
  const { ops, summary } = data;
  const count = h("span", { class: "fv-ops-count", "data-testid": "fv-ops-count" });
  const opFilter = h("input", {
    class: "fv-op-filter",
    "data-testid": "fv-op-filter",
    type: "search",
    placeholder: "filter op names",
    "aria-label": "filter op names",
  });
  opFilter.addEventListener("input", () => store.set({ opText: opFilter.value }));
  const header = h(
    "div",
    { class: "fv-op-row fv-op-header", role: "row" },
    COLUMNS.map((c) => h("span", { class: `fv-c-${c.toLowerCase()}`, role: "columnheader", text: c })),
  );
  const sizer = h("div", { class: "fv-ops-sizer" });
  const viewport = h("div", { class: "fv-ops-viewport", role: "rowgroup", tabindex: 0 }, sizer);
  viewport.style.height = `${VIEW_H}px`;
  const el = h(
    "section",
    { class: "fv-panel fv-ops", "data-testid": "fv-ops", role: "table", "aria-label": "ops" },
    h("div", { class: "fv-panel-head" }, h("h3", { text: "Ops" }), count, opFilter),
    header,
    viewport,
  );
  let rows = new Int32Array(0);
  let drawn = "";

  const str = (table, i) => (i >= 0 ? (ops.strings[table][i] ?? "") : "");

  function rowEl(i, pos) {
    const seq = ops.seq[i];
    const module = str("modules", ops.module[i]);
    const line = str("lines", ops.line[i]);
    // the cell is right-to-left so a long path is cut at its start; the name itself is a left-to-right
    // isolate with its bidi controls written out, so a mark in a module name reorders nothing
    const moduleCell = h(
      "span",
      { class: "fv-c-module fv-link", title: module ? `${module}\n(click to select)` : "" },
      h("bdi", { dir: "ltr", text: module || "top level" }),
    );
    if (module) {
      moduleCell.addEventListener("click", (ev) => {
        ev.stopPropagation();
        ctx.select(module);
      });
    }
    const row = h(
      "div",
      { class: "fv-op-row", role: "row", "data-seq": seq, style: { top: `${pos * ROW_H}px` } },
      h("span", { class: "fv-c-seq", text: fmtInt(seq) }),
      h("span", { class: "fv-c-phase", text: summary.phases[ops.phase[i]] ?? "" }),
      h("span", { class: "fv-c-op", text: str("ops", ops.op[i]), title: str("ops", ops.op[i]) }),
      moduleCell,
      h("span", {
        class: "fv-c-output",
        text: ops.shape[i] >= 0 ? `${fmtTensor(str("dtypes", ops.dtype[i]), str("shapes", ops.shape[i]))} ${str("devices", ops.device[i])}` : "",
      }),
      h("span", { class: "fv-c-bytes", text: ops.nbytes[i] > 0 ? fmtBytes(ops.nbytes[i]) : "" }),
      h("span", { class: "fv-c-flops", text: fmtFlops(ops.flops[i]) }),
      h("span", { class: "fv-c-line", text: shortLine(line), title: line }),
    );
    toggle(row, "fv-current", seq === store.get().cursor);
    row.addEventListener("click", () => store.set({ cursor: seq }));
    return row;
  }

  function renderRows(force = false) {
    const height = viewport.clientHeight || VIEW_H;
    const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(rows.length, Math.ceil((viewport.scrollTop + height) / ROW_H) + OVERSCAN);
    const key = `${first}:${last}`;
    if (!force && key === drawn) return;
    drawn = key;
    const els = [];
    for (let k = first; k < last; k++) els.push(rowEl(rows[k], k));
    sizer.replaceChildren(...els);
  }
  viewport.addEventListener("scroll", () => renderRows());

  function refilter() {
    const st = store.get();
    const sel = ctx.derived.selection;
    rows = filterOps(ops, {
      moduleMask: sel.mask,
      searchMask: ctx.derived.searchMask,
      phase: st.phase ? ctx.phaseCode(st.phase) : -1,
      device: st.device ? ctx.deviceCode(st.device) : -1,
      opMask: textMask(ops.strings.ops, st.opText),
    });
    sizer.style.height = `${rows.length * ROW_H}px`;
    const parts = [`${fmtInt(rows.length)} of ${fmtInt(ops.n)} ops`];
    if (ops.meta.truncated) parts.push(`(ops ${fmtInt(ops.meta.start)}–${fmtInt(ops.meta.stop - 1)} of ${fmtInt(ops.meta.n_ops)} sent)`);
    if (sel.mask) parts.push(`in ${sel.path}`);
    setText(count, parts.join(" "));
    if (viewport.scrollTop > rows.length * ROW_H) viewport.scrollTop = 0;
    renderRows(true);
  }

  function scrollToCursor() {
    const seq = store.get().cursor;
    if (seq < 0) return renderRows(true);
    const seqs = Array.from(rows, (i) => ops.seq[i]);
    const k = Math.min(lowerBound(seqs, seq), Math.max(0, rows.length - 1));
    const height = viewport.clientHeight || VIEW_H;
    const top = k * ROW_H;
    // scroll only when the row is out of view (a click in the table keeps the table still)
    if (top < viewport.scrollTop || top + ROW_H > viewport.scrollTop + height) {
      viewport.scrollTop = Math.max(0, top - height / 2);
    }
    renderRows(true);
  }

  return {
    el,
    update(changed) {
      const all = !changed;
      if (all || ["selected", "search", "phase", "device", "opText"].some((k) => changed.has(k))) refilter();
      if (changed?.has("cursor")) scrollToCursor();
    },
  };
}
