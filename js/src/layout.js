// Geometry of the views (pure functions): the icicle, scales, stacked areas, the alias graph.

/** A linear map from [d0, d1] to [r0, r1] with an inverse. */
export function linear(d0, d1, r0, r1) {
  const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
  const f = (x) => r0 + (x - d0) * k;
  f.invert = (y) => (k === 0 ? d0 : d0 + (y - r0) / k);
  return f;
}

/**
 * The timeline's time axis: op `i` spans the seconds [edge[i], edge[i + 1]] (`edge` ascending, n + 1 values, see
 * readTime in data.js), drawn between pixels r0 and r1. Like `linear` it maps a fractional op index (an op
 * boundary, or `seq + 1`: the op's end) to a pixel; `invert` maps a pixel back to a fractional op index (an op of
 * no duration is never under the pointer), `time` maps seconds to a pixel.
 */
export function timeAxis(edge, r0, r1) {
  const n = edge.length - 1;
  const lin = linear(0, edge[n] || 1, r0, r1);
  const f = (v) => {
    if (!(n > 0)) return lin(0);
    const i = Math.max(0, Math.min(n - 1, Math.floor(v)));
    const frac = Math.max(0, Math.min(1, v - i));
    return lin(edge[i] + frac * (edge[i + 1] - edge[i]));
  };
  f.invert = (px) => {
    if (!(n > 0)) return 0;
    const t = lin.invert(px);
    // the last op that starts at or before t (binary search over the ascending edges)
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (edge[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    const w = edge[lo + 1] - edge[lo];
    return lo + (w > 0 ? Math.max(0, Math.min(0.999, (t - edge[lo]) / w)) : 0);
  };
  f.time = lin;
  return f;
}

/**
 * The icicle below `root` (a tree row, or -1 for all roots): one box per visible row with
 * x0/x1 as fractions of the width and its depth below the root.
 *
 * A row's children share its width in proportion to `value(row)`; when the children add up
 * to more than the row (tied weights count once in the parent) they are scaled to fit, when
 * to less, the rest stays empty (the row's own share). Boxes narrower than `minWidth` and
 * rows deeper than `maxDepth` are left out.
 */
export function icicle(tree, root, value, { maxDepth = 8, minWidth = 0 } = {}) {
  const boxes = [];
  const place = (rows, x0, x1, depth, parentValue) => {
    if (depth > maxDepth || !rows.length) return;
    const vals = rows.map((r) => Math.max(0, value(r) || 0));
    const sum = vals.reduce((a, b) => a + b, 0);
    const denom = Math.max(sum, parentValue || 0);
    if (denom <= 0) return;
    let x = x0;
    rows.forEach((r, k) => {
      const w = ((x1 - x0) * vals[k]) / denom;
      if (w > 0 && w >= minWidth) {
        boxes.push({ row: r, x0: x, x1: x + w, depth });
        place(tree.children[r], x, x + w, depth + 1, vals[k]);
      }
      x += w;
    });
  };
  if (root >= 0) {
    boxes.push({ row: root, x0: 0, x1: 1, depth: 0 });
    place(tree.children[root], 0, 1, 1, Math.max(0, value(root) || 0));
  } else {
    place(tree.roots, 0, 1, 0, 0);
  }
  return boxes;
}

/** Rows from a tree root down to `row` (for the breadcrumb). */
export function ancestry(tree, row) {
  const out = [];
  for (let r = row; r >= 0 && out.length <= tree.n; r = tree.parent[r]) out.push(r);
  return out.reverse();
}

/**
 * SVG paths of a stacked area chart: one {cat, d} per category with any bytes, bottom first.
 * `xs` are positions (already in pixels) of the kept rows `idx` of the columns `cats`.
 */
export function stackedAreas(xs, cats, idx, y) {
  const n = idx.length;
  const base = new Float64Array(n);
  const out = [];
  cats.forEach((col, c) => {
    if (!col) return;
    let any = false;
    for (let k = 0; k < n; k++) if (col[idx[k]] !== 0) any = true;
    if (!any) return;
    const top = new Float64Array(n);
    for (let k = 0; k < n; k++) top[k] = base[k] + col[idx[k]];
    let d = "";
    for (let k = 0; k < n; k++) d += `${k ? "L" : "M"}${r1(xs[k])},${r1(y(top[k]))}`;
    for (let k = n - 1; k >= 0; k--) d += `L${r1(xs[k])},${r1(y(base[k]))}`;
    out.push({ cat: c, d: `${d}Z` });
    base.set(top);
  });
  return out;
}

/** An SVG polyline path through (xs[k], y(values[idx[k]])). */
export function linePath(xs, values, idx, y) {
  let d = "";
  for (let k = 0; k < idx.length; k++) d += `${k ? "L" : "M"}${r1(xs[k])},${r1(y(values[idx[k]]))}`;
  return d;
}

function r1(v) {
  return Math.round(v * 10) / 10;
}

/**
 * A layered layout of the alias graph: parameter names on the left, tensors in the middle
 * (a view one column right of its base, at most `maxViewDepth` columns), storages on the right.
 * Each storage gets a block of rows holding its tensors, each tensor its names, so storage
 * and name edges run almost level. Returns {x, y, column, rows, columns} per node index.
 */
export function aliasLayout(alias, { maxViewDepth = 3 } = {}) {
  const n = alias.nodes;
  const KIND_STORAGE = 0;
  const KIND_TENSOR = 1;
  const storageOf = new Int32Array(n).fill(-1);
  const baseOf = new Int32Array(n).fill(-1);
  const namesOf = Array.from({ length: n }, () => []);
  for (let e = 0; e < alias.edges; e++) {
    const s = alias.src[e];
    const d = alias.dst[e];
    const k = alias.edgeKind[e];
    if (k === 0 && alias.kind[s] === KIND_TENSOR && alias.kind[d] === KIND_STORAGE) storageOf[s] = d;
    else if (k === 1) baseOf[d] = s;
    else if (k === 3 || k === 4) namesOf[d].push(s);
  }
  const viewDepth = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    let dpt = 0;
    for (let b = baseOf[i]; b >= 0 && dpt < n; b = baseOf[b]) dpt++;
    viewDepth[i] = Math.min(dpt, maxViewDepth);
  }
  const tensorsOf = Array.from({ length: n }, () => []);
  const loose = [];
  for (let i = 0; i < n; i++) {
    if (alias.kind[i] !== KIND_TENSOR) continue;
    if (storageOf[i] >= 0) tensorsOf[storageOf[i]].push(i);
    else loose.push(i);
  }
  const y = new Float64Array(n).fill(-1);
  const column = new Int32Array(n);
  const deepest = Math.max(0, ...viewDepth);
  const storageColumn = 2 + deepest;
  let row = 0;
  const placeTensor = (t) => {
    const names = namesOf[t];
    const h = Math.max(1, names.length);
    y[t] = row + (h - 1) / 2;
    column[t] = 1 + viewDepth[t];
    names.forEach((nm, j) => {
      if (y[nm] < 0) {
        y[nm] = row + j;
        column[nm] = 0;
      }
    });
    row += h;
  };
  for (let i = 0; i < n; i++) {
    if (alias.kind[i] !== KIND_STORAGE) continue;
    const start = row;
    tensorsOf[i].sort((a, b) => alias.ref[a] - alias.ref[b]).forEach(placeTensor);
    if (row === start) row += 1;
    y[i] = (start + row - 1) / 2;
    column[i] = storageColumn;
  }
  loose.forEach(placeTensor);
  for (let i = 0; i < n; i++) {
    if (y[i] < 0) {
      y[i] = row++;
      column[i] = 0;
    }
  }
  return { y, column, rows: row, columns: storageColumn + 1 };
}
