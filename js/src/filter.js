// Selection and filtering: which modules a selection covers, which ops pass the filters,
// where a module's ops lie on the timeline, and its share of a peak (pure functions).

/** Rows of the folded tree in the subtree of `node` (itself included), as a 0/1 mask. */
export function subtreeMask(tree, node) {
  const mask = new Uint8Array(tree.n);
  if (node < 0 || node >= tree.n) return mask;
  const stack = [node];
  while (stack.length) {
    const i = stack.pop();
    if (mask[i]) continue;
    mask[i] = 1;
    for (const c of tree.children[i]) stack.push(c);
  }
  return mask;
}

/**
 * What a `selected_module` value covers.
 *
 * A folded tree path ("M.layers.0-79.mlp") selects that row and its subtree: every module
 * folded into one of those rows. Any other module path of the trace ("M.layers.3.mlp")
 * selects that module and the modules below it; its tree row is the folded row holding it.
 * Returns {kind: "node" | "module" | "none", node, module, mask} where `mask[m]` is 1 for each
 * covered module id (ids of the ops' "modules" string table), or null for no selection.
 */
export function resolveSelection(path, tree, ops) {
  const none = { kind: "none", node: -1, module: -1, mask: null, path: path || "" };
  if (!path) return none;
  const nModules = ops.strings.modules.length;
  const node = tree.index.has(path) ? tree.index.get(path) : -1;
  if (node >= 0) {
    const rows = subtreeMask(tree, node);
    const mask = new Uint8Array(nModules);
    for (let m = 0; m < nModules && m < tree.moduleNode.length; m++) {
      const r = tree.moduleNode[m];
      if (r >= 0 && rows[r]) mask[m] = 1;
    }
    return { kind: "node", node, module: ops.moduleIndex.get(path) ?? -1, mask, path };
  }
  const module = ops.moduleIndex.has(path) ? ops.moduleIndex.get(path) : -1;
  if (module < 0) return none;
  const mask = new Uint8Array(nModules);
  const prefix = `${path}.`;
  ops.strings.modules.forEach((p, m) => {
    if (p === path || p.startsWith(prefix)) mask[m] = 1;
  });
  const r = module < tree.moduleNode.length ? tree.moduleNode[module] : -1;
  return { kind: "module", node: r, module, mask, path };
}

/** 0/1 mask over the strings of `table` containing `text` (case-insensitive); null if no text. */
export function textMask(table, text) {
  const q = (text || "").trim().toLowerCase();
  if (!q) return null;
  return Uint8Array.from(table, (s) => (String(s).toLowerCase().includes(q) ? 1 : 0));
}

/** Rows of the folded tree whose path contains `text` (case-insensitive). */
export function searchTree(tree, text, limit = Infinity) {
  const q = (text || "").trim().toLowerCase();
  const out = [];
  if (!q) return out;
  for (let i = 0; i < tree.n && out.length < limit; i++) {
    if (tree.path[i].toLowerCase().includes(q)) out.push(i);
  }
  return out;
}

/** Module paths of the trace containing `text`, for the search box's list (folded rows excluded). */
export function searchModules(modules, text, limit = 20, exclude = new Set()) {
  const q = (text || "").trim().toLowerCase();
  const out = [];
  if (!q) return out;
  for (let m = 0; m < modules.length && out.length < limit; m++) {
    const p = modules[m];
    if (!exclude.has(p) && p.toLowerCase().includes(q)) out.push(m);
  }
  return out;
}

/**
 * Row indices of the ops that pass every filter:
 *   moduleMask  ops whose module is covered (null: all ops, including top-level ones)
 *   searchMask  ops whose module path matches the search (null: no search)
 *   phase       phase code (-1: any)
 *   device      device id of the first output (-1: any)
 *   opMask      ops whose op name matches (null: any)
 */
export function filterOps(ops, { moduleMask = null, searchMask = null, phase = -1, device = -1, opMask = null } = {}) {
  const out = new Int32Array(ops.n);
  let k = 0;
  for (let i = 0; i < ops.n; i++) {
    const m = ops.module[i];
    if (moduleMask && !(m >= 0 && moduleMask[m])) continue;
    if (searchMask && !(m >= 0 && searchMask[m])) continue;
    if (phase >= 0 && ops.phase[i] !== phase) continue;
    if (device >= 0 && ops.device[i] !== device) continue;
    if (opMask && !opMask[ops.op[i]]) continue;
    out[k++] = i;
  }
  return out.subarray(0, k);
}

/**
 * The seq intervals [start, stop) where the covered modules run, merging runs separated by
 * fewer than `minGap` ops (so a span list never has more entries than the pixels it is drawn on).
 */
export function moduleSpans(ops, moduleMask, minGap = 1) {
  const spans = [];
  if (!moduleMask) return spans;
  let start = -1;
  let last = -2;
  for (let i = 0; i < ops.n; i++) {
    const m = ops.module[i];
    if (!(m >= 0 && moduleMask[m])) continue;
    const s = ops.seq[i];
    if (start >= 0 && s - last <= minGap) {
      last = s;
      continue;
    }
    if (start >= 0) spans.push([start, last + 1]);
    start = s;
    last = s;
  }
  if (start >= 0) spans.push([start, last + 1]);
  return spans;
}

/** Bytes per category that the covered modules hold at a device's peak (its `attr` arrays). */
export function peakShare(attr, moduleMask, nCategories) {
  const out = new Float64Array(nCategories);
  if (!moduleMask || !attr || !attr.module) return out;
  for (let i = 0; i < attr.module.length; i++) {
    const m = attr.module[i];
    if (m >= 0 && moduleMask[m]) out[attr.category[i]] += attr.bytes[i];
  }
  return out;
}

/** Index of `seq` in the sorted `seqs` (the row showing that op), or -1. */
export function rowOfSeq(seqs, seq) {
  let lo = 0;
  let hi = seqs.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (seqs[mid] === seq) return mid;
    if (seqs[mid] < seq) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

/** Index of the first entry of the sorted `values` that is >= x (values.length if none). */
export function lowerBound(values, x) {
  let lo = 0;
  let hi = values.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (values[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Index of the entry of the sorted `values` nearest to x (-1 if empty). */
export function nearest(values, x) {
  if (!values.length) return -1;
  const i = lowerBound(values, x);
  if (i <= 0) return 0;
  if (i >= values.length) return values.length - 1;
  return x - values[i - 1] <= values[i] - x ? i - 1 : i;
}
