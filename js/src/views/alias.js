// The alias graph neighbourhood: parameter names -> tensors (views one column right of their
// base) -> storages, with in-place writes; the selected module's nodes highlighted.
import { h, s, setText, tip, toggle, watchWidth, widthOf } from "../dom.js";
import { fmtBytes, plainName, shortPath } from "../format.js";
import { aliasLayout } from "../layout.js";

const ROW = 18;
const NAME_W = 240;
const TENSOR_W = 232;
const STORAGE_W = 220;
const MAX_LABEL = 34;
const GAP = 40; // before the storage column: where the edges into a storage bend
const CHAR_W = 6.1; // 10px monospace
const LABEL_X = 16;

export function aliasView(ctx) {
  const { data } = ctx;
  const { ops } = data;
  const info = h("span", { class: "fv-hint", "data-testid": "fv-alias-info" });
  const scroll = h("div", { class: "fv-alias-scroll" });
  const el = h(
    "section",
    { class: "fv-panel fv-alias", "data-testid": "fv-alias" },
    h("div", { class: "fv-panel-head" }, h("h3", { text: "Aliasing" }), info),
    h(
      "ul",
      { class: "fv-legend" },
      ["storage", "view", "write", "name", "tied"].map((k) => h("li", {}, h("span", { class: `fv-swatch fv-edge-swatch fv-edge-${k}` }), k)),
    ),
    scroll,
  );
  const nodeEls = [];
  const edgeEls = [];

  function render() {
    const alias = ctx.data.alias; // replaced when the kernel redraws the neighbourhood
    const meta = alias.meta || {};
    if (!alias.nodes) {
      setText(info, "");
      scroll.replaceChildren(h("p", { class: "fv-empty", text: "no tensors to show" }));
      return;
    }
    const shown = Array.from(alias.kind).filter((k) => k !== 2).length;
    setText(info, `${shown} of ${meta.total_nodes ?? shown} storages and tensors${meta.truncated ? ` (bounded at ${meta.max_nodes} nodes)` : ""}${meta.around ? ` around ${meta.around}` : ""}`);
    const lay = aliasLayout(alias, { maxViewDepth: viewDepth(widthOf(scroll, 1000)) });
    const colX = (c) => (c === 0 ? 6 : c === lay.columns - 1 ? NAME_W + (lay.columns - 2) * TENSOR_W + GAP : NAME_W + (c - 1) * TENSOR_W);
    const width = NAME_W + (lay.columns - 2) * TENSOR_W + GAP + STORAGE_W;
    const height = lay.rows * ROW + 8;
    // drawn at its real size (the panel scrolls), so the labels are never scaled
    const svg = s("svg", { class: "fv-alias-svg", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": "alias graph" });
    svg.style.width = `${width}px`;
    svg.style.height = `${height}px`;
    // edges leave a tensor after its label, never across it
    const rightOf = (i) => {
      const c = lay.column[i];
      if (c === 0) return colX(0) + NAME_W - 24;
      if (alias.kind[i] === 0) return colX(c) + 12;
      return colX(c) + LABEL_X + clip(alias.label[i]).length * CHAR_W + 4;
    };
    const py = (i) => 4 + lay.y[i] * ROW + ROW / 2;
    const gEdges = s("g", { class: "fv-edges" });
    const edgeKinds = meta.edge_kinds || [];
    edgeEls.length = 0;
    for (let e = 0; e < alias.edges; e++) {
      const a = alias.src[e];
      const b = alias.dst[e];
      const kind = edgeKinds[alias.edgeKind[e]] || "edge";
      const [l, r] = lay.column[a] <= lay.column[b] ? [a, b] : [b, a];
      const x1 = rightOf(l);
      const x2 = colX(lay.column[r]);
      const [y1, y2] = [py(l), py(r)];
      let d;
      if (lay.column[l] === lay.column[r]) {
        // a view drawn in its base's column (deeper than the panel has room for): a bracket on the left
        const xc = colX(lay.column[l]) + 4;
        d = `M${xc},${y1}C${xc - 16},${y1} ${xc - 16},${y2} ${xc},${y2}`;
      } else if (lay.column[r] === lay.columns - 1) {
        // into a storage: level along the tensor's own row (no other label there), bend in the gap
        const xb = x2 - GAP + 6;
        d = `M${x1},${y1}H${Math.max(x1, xb)}C${x2 - 10},${y1} ${x2 - 24},${y2} ${x2},${y2}`;
      } else {
        const mid = (x1 + x2) / 2;
        d = `M${x1},${y1}C${mid},${y1} ${mid},${y2} ${x2},${y2}`;
      }
      const op = alias.edgeOp[e] >= 0 ? alias.ops[alias.edgeOp[e]] : "";
      const path = s("path", { class: `fv-edge fv-edge-${kind}`, d });
      path.appendChild(tip(`${kind}${op ? `: ${op}` : ""}${alias.edgeSeq[e] >= 0 ? ` at op ${alias.edgeSeq[e]}` : ""}`));
      gEdges.appendChild(path);
      edgeEls.push([path, a, b]);
    }
    const gNodes = s("g", { class: "fv-anodes" });
    const nodeKinds = meta.node_kinds || [];
    nodeEls.length = 0;
    for (let i = 0; i < alias.nodes; i++) {
      const kind = nodeKinds[alias.kind[i]] || "node";
      const x = colX(lay.column[i]);
      const y = py(i);
      const text = nodeText(i, kind);
      const g = s("g", { class: `fv-anode fv-anode-${kind}`, "data-node": i, transform: `translate(${x},${y})` });
      g.appendChild(kind === "storage" ? s("rect", { x: 0, y: -6, width: 12, height: 12, rx: 2 }) : s("circle", { cx: kind === "name" ? NAME_W - 30 : 4, cy: 0, r: 4 }));
      g.appendChild(s("text", { x: kind === "name" ? NAME_W - 38 : LABEL_X, y: 4, "text-anchor": kind === "name" ? "end" : "start", text: clip(plainName(text)) }));
      g.appendChild(tip(fullText(i, kind)));
      const m = alias.module[i];
      if (m >= 0) {
        g.classList.add("fv-link");
        g.addEventListener("click", () => ctx.select(ops.strings.modules[m]));
      }
      gNodes.appendChild(g);
      nodeEls.push(g);
    }
    svg.append(gEdges, gNodes);
    scroll.replaceChildren(svg);
  }

  function nodeText(i, kind) {
    const alias = ctx.data.alias;
    if (kind === "storage") {
      const cat = alias.category[i] >= 0 ? data.summary.categories[alias.category[i]] : "";
      return `storage ${alias.ref[i]} · ${fmtBytes(alias.nbytes[i])}${cat ? ` · ${cat}` : ""}`;
    }
    if (kind === "name") return shortPath(alias.label[i], 3);
    return alias.label[i];
  }

  function fullText(i, kind) {
    const alias = ctx.data.alias;
    const parts = [alias.label[i]];
    if (alias.names[i] && kind !== "name") parts.push(`names: ${alias.names[i].split("|").join(", ")}`);
    if (alias.writes[i] > 0) parts.push(`written in place ${alias.writes[i]} time(s)`);
    if (alias.module[i] >= 0) parts.push(`module: ${ops.strings.modules[alias.module[i]]} (click to select)`);
    return parts.join("\n");
  }

  function marks() {
    const alias = ctx.data.alias;
    const mask = ctx.derived.selection.mask;
    const on = (i) => Boolean(mask && alias.module[i] >= 0 && mask[alias.module[i]]);
    for (let i = 0; i < nodeEls.length; i++) toggle(nodeEls[i], "fv-highlight", on(i));
    for (const [path, a, b] of edgeEls) toggle(path, "fv-highlight", on(a) && on(b));
    toggle(scroll, "fv-has-selection", Boolean(mask));
  }

  // a wider or narrower panel may hold another number of view columns
  let depth = -1;
  const unwatch = watchWidth(scroll, (w) => {
    const d = viewDepth(w);
    if (depth >= 0 && d !== depth) {
      render();
      marks();
    }
    depth = d;
  });

  return {
    el,
    destroy: unwatch,
    update(changed) {
      if (!changed || changed.has("alias")) render();
      if (!changed || changed.has("selected") || changed.has("alias")) marks();
    },
  };
}

/** As many view columns (a view right of its base) as fit `width`: at least one, at most 3. */
function viewDepth(width) {
  return Math.max(1, Math.min(3, Math.floor((width - NAME_W - STORAGE_W) / TENSOR_W) - 1));
}

function clip(text) {
  return text.length > MAX_LABEL ? `${text.slice(0, MAX_LABEL - 1)}…` : text;
}
