// The folded layer tree as an icicle: click to select (and drill into) a module, breadcrumb to go back.
import { h, setText, toggle } from "../dom.js";
import { searchTree, subtreeMask } from "../filter.js";
import { SIZE_BY, fmtBytes, fmtInt, fmtSI } from "../format.js";
import { ancestry, icicle } from "../layout.js";
import { treeKeyColor } from "../palette.js";

const ROW_H = 26;
const MAX_DEPTH = 7;

export function treeView(ctx) {
  const { data, store } = ctx;
  const { tree } = data;
  const crumbs = h("nav", { class: "fv-breadcrumb", "data-testid": "fv-breadcrumb", "aria-label": "tree path" });
  const icicleEl = h("div", { class: "fv-icicle", role: "tree" });
  const detail = h("div", { class: "fv-tree-detail", "data-testid": "fv-tree-detail" });
  const hint = h("span", { class: "fv-hint" });
  // colour the boxes by the device or dtype holding most of each module's parameters, or by the precision of its weights
  const colorBy = h(
    "select",
    { class: "fv-color-by", "data-testid": "fv-color-by", "aria-label": "colour the tree by" },
    [
      ["", "no colour"],
      ["device", "colour by device"],
      ["dtype", "colour by dtype"],
      ["precision", "colour by precision"],
    ].map(([v, label]) => h("option", { value: v, text: label })),
  );
  colorBy.addEventListener("change", () => store.set({ colorBy: colorBy.value }));
  const colorLegend = h("ul", { class: "fv-legend fv-color-legend", "data-testid": "fv-color-legend" });
  const el = h(
    "section",
    { class: "fv-panel fv-tree", "data-testid": "fv-tree" },
    h("div", { class: "fv-panel-head" }, h("h3", { text: "Layer tree" }), hint, colorBy),
    colorLegend,
    crumbs,
    icicleEl,
    detail,
  );
  let nodes = new Map(); // row -> element

  const sizeOf = () => SIZE_BY[store.get().sizeBy] || SIZE_BY.param_bytes;

  function activate(row) {
    const st = store.get();
    const path = tree.path[row];
    // a click on the box at the top of a drilled-in view goes one level up
    if (row === st.zoom && st.selected === path) {
      store.set({ zoom: tree.parent[row] >= 0 ? tree.parent[row] : -1, selected: path });
      return;
    }
    store.set({ selected: path, zoom: tree.children[row].length ? row : st.zoom });
  }

  function renderIcicle() {
    const st = store.get();
    const size = sizeOf();
    setText(hint, `sized by ${size.label}; click to select and drill down`);
    if (!tree.n) {
      icicleEl.replaceChildren(h("p", { class: "fv-empty", text: "no modules were called in this run" }));
      icicleEl.style.height = "";
      return;
    }
    const value = (r) => size.value(tree.figures, r);
    const boxes = icicle(tree, st.zoom, value, { maxDepth: MAX_DEPTH, minWidth: 0.0015 });
    const depth = boxes.reduce((m, b) => Math.max(m, b.depth), 0);
    icicleEl.style.height = `${(depth + 1) * ROW_H}px`;
    nodes = new Map();
    const els = boxes.map((b) => {
      const r = b.row;
      const name = tree.name[r];
      const v = value(r);
      const node = h(
        "div",
        {
          class: `fv-node${tree.odd[r] ? " fv-odd" : ""}${tree.count[r] > 1 ? " fv-folded" : ""}`,
          role: "treeitem",
          tabindex: 0,
          "data-path": tree.path[r],
          "data-row": r,
          title: `${tree.path[r]}\n${tree.cls[r]}${tree.count[r] > 1 ? ` x${tree.count[r]}` : ""}${weightsTitle(r)}\n${size.label}: ${size.fmt(v)}${colorTitle(r)}`,
          style: {
            left: `${(b.x0 * 100).toFixed(4)}%`,
            width: `${((b.x1 - b.x0) * 100).toFixed(4)}%`,
            top: `${b.depth * ROW_H}px`,
            height: `${ROW_H - 2}px`,
          },
        },
        h("span", { class: "fv-node-name", text: name }),
        h("span", { class: "fv-node-value", text: size.fmt(v) }),
      );
      node.addEventListener("click", () => activate(r));
      node.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          activate(r);
        }
      });
      const key = colorKey(r);
      if (key >= 0) {
        node.classList.add("fv-keyed", `fv-key-${key}`);
        node.setAttribute("data-color", colorTable().keys[key]);
        paint(node, key);
      }
      nodes.set(r, node);
      return node;
    });
    icicleEl.replaceChildren(...els);
  }

  // the key's colour from Python (summary.palette.tree), as the plotly layer tree draws it
  function paint(el, key) {
    const color = treeKeyColor(data.summary.palette, store.get().colorBy, key);
    if (color) el.style.setProperty("--fv-key", color);
    return el;
  }

  function colorTable() {
    return tree.colors[store.get().colorBy] || null;
  }

  function colorKey(r) {
    const c = colorTable();
    return c ? c.code[r] ?? -1 : -1;
  }

  // "weights: nf4+dq + LoRA bf16" (Note: [weight precision]); nothing for a module without weights, or when the
  // tree is coloured by precision (colorTitle says it then)
  function weightsTitle(r) {
    const p = tree.precision[r];
    return p && store.get().colorBy !== "precision" ? `\nweights: ${p}` : "";
  }

  function colorTitle(r) {
    const c = colorTable();
    return c && c.code[r] >= 0 ? `\n${store.get().colorBy}: ${c.keys[c.code[r]]}` : "";
  }

  function renderLegend() {
    const c = colorTable();
    colorBy.value = store.get().colorBy || "";
    colorLegend.replaceChildren(
      ...(c ? c.keys.map((k, i) => h("li", {}, paint(h("span", { class: `fv-swatch fv-key-${i}` }), i), k)) : []),
    );
    colorLegend.hidden = !c;
  }

  function renderCrumbs() {
    const st = store.get();
    const trail = st.zoom >= 0 ? ancestry(tree, st.zoom) : [];
    const item = (text, zoom, path) => {
      const b = h("button", { type: "button", class: "fv-crumb", text, title: path || "all modules" });
      b.addEventListener("click", () => store.set({ zoom, ...(path ? { selected: path } : {}) }));
      return b;
    };
    crumbs.replaceChildren(
      item("all", -1, ""),
      ...trail.flatMap((r) => [h("span", { class: "fv-crumb-sep", text: "›" }), item(tree.name[r], r, tree.path[r])]),
    );
  }

  function renderMarks() {
    const st = store.get();
    const sel = ctx.derived.selection;
    const inSel = sel.node >= 0 ? subtreeMask(tree, sel.node) : null;
    const matches = new Set(searchTree(tree, st.search));
    toggle(icicleEl, "fv-searching", matches.size > 0);
    for (const [r, node] of nodes) {
      toggle(node, "fv-selected", r === sel.node);
      toggle(node, "fv-in-selection", inSel && inSel[r] && r !== sel.node);
      toggle(node, "fv-match", matches.has(r));
      node.setAttribute("aria-selected", String(r === sel.node));
    }
  }

  function renderDetail() {
    const sel = ctx.derived.selection;
    const r = sel.node;
    if (r < 0) {
      detail.replaceChildren(h("p", { class: "fv-hint", text: "Select a module to see its figures and its ops." }));
      return;
    }
    const f = tree.figures;
    const fig = (k) => (f[k] ? f[k][r] : undefined);
    const rows = [
      ["class", tree.cls[r]],
      ["weights", tree.precision[r] || "none"],
      ["folded", tree.count[r] > 1 ? `${tree.count[r]} modules${tree.odd[r] ? " (odd one out)" : ""}` : "no"],
      ["parameters", fmtSI(fig("params"))],
      ["parameter bytes", fmtBytes(fig("param_bytes"))],
      ["buffer bytes", fmtBytes(fig("buffer_bytes"))],
      ["activations made", fmtBytes(fig("act_bytes"))],
      ["saved for backward", fmtBytes(fig("act_saved_bytes"))],
      ["gradients", fmtBytes(fig("grad_bytes"))],
      ["optimizer state", fmtBytes(fig("opt_bytes"))],
      ["FLOPs fwd / bwd", `${fmtSI(fig("flops_fwd"), "FLOP")} / ${fmtSI(fig("flops_bwd"), "FLOP")}`],
      ["ops fwd / bwd", `${fmtInt(fig("ops_fwd"))} / ${fmtInt(fig("ops_bwd"))}`],
    ];
    if (fig("unknown_flop_ops")) rows.push(["ops without a FLOP formula", fmtInt(fig("unknown_flop_ops"))]);
    if (tree.tied[r]) rows.push(["tied weights", "yes (counted once)"]);
    const heading =
      sel.kind === "module"
        ? `${sel.path} — one of the modules folded into ${tree.path[r]}; figures below are the fold's`
        : tree.path[r];
    detail.replaceChildren(
      h("div", { class: "fv-detail-path", text: heading }),
      h(
        "dl",
        { class: "fv-figures" },
        rows.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]),
      ),
    );
  }

  return {
    el,
    update(changed) {
      const all = !changed;
      if (changed?.has("selected") && !changed.has("zoom")) {
        // a selection made elsewhere (search, kernel, alias graph): zoom so that its row shows
        const r = ctx.derived.selection.node;
        if (r >= 0 && !nodes.has(r)) store.set({ zoom: tree.parent[r] >= 0 ? tree.parent[r] : -1 });
      }
      if (all || changed.has("zoom") || changed.has("sizeBy") || changed.has("colorBy")) {
        renderIcicle();
        renderCrumbs();
        renderLegend();
      }
      if (all || ["zoom", "sizeBy", "colorBy", "selected", "search"].some((k) => changed.has(k))) {
        renderMarks();
      }
      if (all || changed.has("selected")) renderDetail();
    },
  };
}
