// Min-max decimation: keep the rows that preserve a curve's envelope (pure functions).

/**
 * Row indices of `values` that keep its shape with at most about `maxPoints` rows:
 * `values` is cut into equal buckets; each keeps the row of its minimum and of its maximum
 * (the first such row), plus the first and last rows, the first global maximum (the peak)
 * and every index in `keep`. The same rule as fakeviz._views.explorer.decimate_minmax.
 */
export function minmaxIndices(values, maxPoints, keep = []) {
  const n = values.length;
  if (n <= maxPoints) return Int32Array.from({ length: n }, (_, i) => i);
  let peak = 0;
  for (let i = 1; i < n; i++) if (values[i] > values[peak]) peak = i;
  const extra = new Set([0, n - 1, peak, ...keep.filter((k) => k >= 0 && k < n)]);
  const buckets = Math.max(1, Math.floor((maxPoints - extra.size) / 2));
  const out = new Set(extra);
  for (let b = 0; b < buckets; b++) {
    const a = Math.floor((b * n) / buckets);
    const e = Math.floor(((b + 1) * n) / buckets);
    if (e <= a) continue;
    let lo = a;
    let hi = a;
    for (let i = a + 1; i < e; i++) {
      if (values[i] < values[lo]) lo = i;
      if (values[i] > values[hi]) hi = i;
    }
    out.add(lo);
    out.add(hi);
  }
  return Int32Array.from([...out].sort((x, y) => x - y));
}

/**
 * Decimate points at positions `xs` (sorted) to pixel columns: per column of `columns`
 * between x0 and x1, the indices of the min and max of `values`, plus the first and last
 * point and the indices in `keep`. For drawing an already decimated series at a given width.
 */
export function minmaxByColumn(xs, values, x0, x1, columns, keep = []) {
  const n = xs.length;
  if (n <= 2 * columns) return Int32Array.from({ length: n }, (_, i) => i);
  const span = x1 - x0 || 1;
  const lo = new Int32Array(columns).fill(-1);
  const hi = new Int32Array(columns).fill(-1);
  for (let i = 0; i < n; i++) {
    const c = Math.min(columns - 1, Math.max(0, Math.floor(((xs[i] - x0) / span) * columns)));
    if (lo[c] < 0 || values[i] < values[lo[c]]) lo[c] = i;
    if (hi[c] < 0 || values[i] > values[hi[c]]) hi[c] = i;
  }
  const out = new Set([0, n - 1, ...keep.filter((k) => k >= 0 && k < n)]);
  for (let c = 0; c < columns; c++) {
    if (lo[c] >= 0) out.add(lo[c]);
    if (hi[c] >= 0) out.add(hi[c]);
  }
  return Int32Array.from([...out].sort((x, y) => x - y));
}
