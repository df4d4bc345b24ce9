// Turn the widget's traits into the structures the views read (pure: no DOM).
import { unpack } from "./decode.js";

/** Everything the panel shows, from a getter of trait values (model.get). */
export function readData(get) {
  const summary = get("summary") || {};
  return {
    summary: {
      devices: summary.devices || [],
      categories: summary.categories || [],
      phases: summary.phases || [],
      nOps: summary.n_ops || 0,
      capacity: summary.capacity ?? null,
      capacitySpec: summary.capacity_spec ?? null,
      verdict: summary.verdict || null,
      peaks: summary.peaks || {},
      error: summary.error || null,
      palette: summary.palette || null,
    },
    tree: readTree(unpack(get("tree"))),
    memory: readMemory(unpack(get("memory"))),
    ops: readOps(unpack(get("ops"))),
    alias: readAlias(unpack(get("alias"))),
    time: readTime(unpack(get("time"))),
  };
}

export function readTree(pack) {
  if (!pack) return emptyTree();
  const { arrays: a, strings: s, meta } = pack;
  const n = meta.rows ?? (s.path || []).length;
  const children = Array.from({ length: n }, () => []);
  const roots = [];
  for (let i = 0; i < n; i++) {
    const p = a.parent[i];
    if (p >= 0 && p < n) children[p].push(i);
    else roots.push(i);
  }
  const figures = {};
  for (const k of meta.figures || []) figures[k] = a[k];
  const index = new Map();
  for (let i = 0; i < n; i++) index.set(s.path[i], i);
  return {
    n,
    parent: a.parent,
    depth: a.depth,
    count: a.count,
    odd: a.odd,
    tied: a.tied,
    path: s.path || [],
    name: s.name || [],
    cls: s.class || [],
    // the precision of each row's weights ("bf16", "nf4+dq + LoRA bf16", "mixed"; "" none); older payloads lack it
    precision: s.precision || new Array(n).fill(""),
    figures,
    moduleNode: a.module_node || new Int32Array(0),
    // colour keys: the device / dtype holding most of each module's parameter bytes
    colors: {
      device: { code: a.color_device || new Int32Array(n).fill(-1), keys: s.color_device || [] },
      dtype: { code: a.color_dtype || new Int32Array(n).fill(-1), keys: s.color_dtype || [] },
      precision: { code: a.color_precision || new Int32Array(n).fill(-1), keys: s.color_precision || [] },
    },
    children,
    roots,
    index,
  };
}

function emptyTree() {
  return {
    n: 0, parent: [], depth: [], count: [], odd: [], tied: [], path: [], name: [], cls: [], figures: {},
    moduleNode: new Int32Array(0), children: [], roots: [], index: new Map(),
    precision: [],
    colors: {
      device: { code: new Int32Array(0), keys: [] },
      dtype: { code: new Int32Array(0), keys: [] },
      precision: { code: new Int32Array(0), keys: [] },
    },
  };
}

export function readMemory(pack) {
  if (!pack) return { devices: [], categories: [], phaseRuns: { phase: [], start: [], stop: [] }, nOps: 0 };
  const { arrays: a, meta } = pack;
  const categories = meta.categories || [];
  const devices = (meta.devices || []).map((d) => {
    const dev = d.device;
    const seq = a[`${dev}/seq`];
    const cats = categories.map((c) => a[`${dev}/${c}`]);
    const total = new Float64Array(seq.length);
    for (const col of cats) for (let i = 0; i < seq.length; i++) total[i] += col[i];
    return {
      device: dev,
      seq,
      cats,
      total,
      allocated: d.allocator ? a[`${dev}/allocated`] : null,
      reserved: d.allocator ? a[`${dev}/reserved`] : null,
      peakSeq: d.peak_seq,
      attr: { module: a[`${dev}/attr_module`], category: a[`${dev}/attr_category`], bytes: a[`${dev}/attr_bytes`] },
    };
  });
  return {
    devices,
    categories,
    phases: meta.phases || [],
    nOps: meta.n_ops || 0,
    phaseRuns: { phase: a["phase_runs/phase"], start: a["phase_runs/start"], stop: a["phase_runs/stop"] },
  };
}

export function readOps(pack) {
  if (!pack) {
    const z = new Int32Array(0);
    return {
      n: 0, seq: z, op: z, module: z, phase: z, device: z, line: z, shape: z, dtype: z, nbytes: z, flops: z,
      strings: { ops: [], modules: [], lines: [], shapes: [], dtypes: [], devices: [] },
      meta: { n_ops: 0, start: 0, stop: 0, truncated: false }, moduleIndex: new Map(),
    };
  }
  const { arrays: a, strings: s, meta } = pack;
  const moduleIndex = new Map();
  (s.modules || []).forEach((p, i) => moduleIndex.set(p, i));
  return { n: a.seq.length, ...pick(a), strings: s, meta, moduleIndex };
}

function pick(a) {
  const out = {};
  for (const k of ["seq", "op", "module", "phase", "device", "line", "shape", "dtype", "nbytes", "flops"]) out[k] = a[k];
  return out;
}

/**
 * Every op's estimated time on one GPU (fakeviz._views.payload.time_pack), or null without one: `end` (its end on
 * the step's critical path), `est` (its own time; 0 for the ops of the untimed class), `code` (class * bounds + bound),
 * and `edge`, the time axis: op i spans [edge[i], edge[i + 1]] with edge[i + 1] = the earliest end of ops i..n-1, so
 * the axis keeps the op order and every op that ends last on the compute stream sits at its end; a collective still
 * running on its own stream when later ops end is drawn where they end (its end is in the hover).
 */
export function readTime(pack) {
  if (!pack) return null;
  const { arrays: a, meta } = pack;
  const end = a.end_s;
  const n = end ? end.length : 0;
  if (!n) return null;
  const bounds = meta.bounds || [];
  const classes = meta.classes || [];
  const untimed = classes.indexOf(meta.untimed);
  const nb = bounds.length || 1;
  const est = new Float64Array(n);
  let k = 0;
  for (let i = 0; i < n; i++) if (Math.floor(a.code[i] / nb) !== untimed) est[i] = a.est_s[k++];
  const edge = new Float64Array(n + 1);
  let m = Infinity;
  for (let i = n - 1; i >= 0; i--) {
    m = Math.min(m, end[i]);
    edge[i + 1] = Math.max(0, m);
  }
  return {
    n,
    gpu: meta.gpu ?? "",
    stepS: meta.step_s ?? edge[n],
    timed: meta.timed ?? "",
    bound: meta.bound ?? "",
    end,
    est,
    code: a.code,
    classes,
    bounds,
    edge,
    cls: (i) => classes[Math.floor(a.code[i] / nb)] ?? "",
    boundOf: (i) => bounds[a.code[i] % nb] ?? "",
  };
}

export function readAlias(pack) {
  if (!pack) return { nodes: 0, edges: 0, meta: {}, kind: [], label: [], names: [] };
  const { arrays: a, strings: s, meta } = pack;
  return {
    nodes: a.node_kind.length,
    edges: a.edge_src.length,
    meta,
    kind: a.node_kind,
    ref: a.node_ref,
    nbytes: a.node_nbytes,
    category: a.node_category,
    writes: a.node_writes,
    module: a.node_module,
    label: s.label || [],
    names: s.names || [],
    src: a.edge_src,
    dst: a.edge_dst,
    edgeKind: a.edge_kind,
    edgeOp: a.edge_op,
    edgeSeq: a.edge_seq,
    ops: s.ops || [],
  };
}
