// A small but complete widget state, shaped like what fakeviz._views.payload.build_state sends:
// a root module with a folded pair of blocks, a head, and a module whose name is markup.
import { pack } from "./pack.js";

export const EVIL = "<script>alert(1)</script>";
export const CATEGORIES = ["Parameter", "Buffer", "Gradient", "Optimizer state", "Activation", "Temporary", "Input", "Other"];
export const PHASES = ["init", "forward", "backward", "optimizer", "other"];

// module ids (the trace's "modules" table) and the folded rows they belong to
export const MODULES = ["Net", "Net.blocks", "Net.blocks.0", "Net.blocks.0.fc", "Net.blocks.1", "Net.blocks.1.fc", "Net.head", `Net.${EVIL}`];
export const ROWS = ["Net", "Net.blocks", "Net.blocks.0-1", "Net.blocks.0-1.fc", "Net.head", `Net.${EVIL}`];
const MODULE_NODE = [0, 1, 2, 3, 2, 3, 4, 5];
const PARENT = [-1, 0, 1, 2, 0, 0];

// 12 ops: 0-1 init (no module), 2-7 forward, 8-11 backward
export const OPS = {
  op: [0, 0, 1, 2, 1, 2, 1, 3, 4, 4, 5, 5],
  module: [-1, -1, 3, 3, 5, 5, 6, 7, 6, 5, 3, 3],
  phase: [0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2],
};
const OP_NAMES = ["aten.empty", "aten.mm", "aten.relu", "aten.sum", "aten.mm_backward", "aten.add_"];

// the time pack (fakeviz._views.payload.time_pack) of those ops on an H100: kernel class and bound per op (the
// payload's code is class * 4 + bound), each op's own time, its end on the step (the host issues the first ops)
export const CLASSES = ["none", "gemm", "grouped_gemm", "attention", "attention_backward", "conv", "elementwise", "reduction", "copy", "foreach", "collective", "sync"];
export const BOUNDS = ["none", "compute", "memory", "latency"];
const OP_CLASS = ["none", "none", "gemm", "elementwise", "gemm", "elementwise", "gemm", "reduction", "gemm", "gemm", "elementwise", "elementwise"];
const OP_BOUND = ["none", "none", "compute", "memory", "compute", "memory", "latency", "latency", "compute", "compute", "memory", "memory"];
export const EST = [0, 0, 4e-3, 1e-3, 4e-3, 1e-3, 20e-6, 10e-6, 8e-3, 8e-3, 2e-3, 2e-3];
export const END = (() => {
  let t = 24e-6;
  return EST.map((e, i) => (i < 2 ? 12e-6 * (i + 1) : (t += e)));
})();
export function timePack({ gpu = "H100", end = END, est = EST, cls = OP_CLASS, bound = OP_BOUND } = {}) {
  const timed = est.filter((_, i) => cls[i] !== "none");
  return pack({
    // the step without the set-up (ops 0-1, the init phase): what fakeviz/_views/payload.py time_pack sends
    meta: { gpu, n_ops: end.length, step_s: end.at(-1) - end[1], timed: "the training step (ops 2 to 11, after the set-up)", step_start: 2, gpu_s: est.reduce((a, b) => a + b, 0), host_s: 3.7e-4, comm_s: 0, exposed_comm_s: 0, bound: "gpu", classes: CLASSES, bounds: BOUNDS, untimed: "none", source: "test" },
    arrays: {
      end_s: ["f4", end],
      code: ["i1", cls.map((c, i) => CLASSES.indexOf(c) * BOUNDS.length + BOUNDS.indexOf(bound[i]))],
      est_s: ["f4", timed],
    },
  });
}

// summary.palette as Python sends it (fakeviz._core.palette.palette() plus the tree keys' colours): made-up
// colours, so a test can tell that the panel draws with what it was sent
const shade = (i) => `#0000${(16 + i).toString(16)}`;
export const PALETTE = {
  categories: CATEGORIES.map((_, i) => shade(i)),
  phases: PHASES.map((_, i) => shade(32 + i)),
  edges: { storage: shade(48), view: shade(49), write: shade(50), name: shade(51), tied: shade(52) },
  cycle: [shade(64), shade(65)],
  none: shade(80),
  tree: {
    device: [shade(64), shade(65), shade(80)],
    dtype: [shade(64), shade(80)],
    precision: [shade(64), shade(65), shade(64), shade(80)],
  },
};

// the precision of each tree row's weights (Note: [weight precision]): the blocks in NF4 with LoRA, the head bf16;
// precision: false leaves them out, as a payload written before they existed
const PRECISION = ["mixed", "nf4 + LoRA bf16", "nf4 + LoRA bf16", "nf4 + LoRA bf16", "bf16", ""];

export function state({ selected = "", precision = true } = {}) {
  const n = OPS.op.length;
  const fig = (vals) => ["f8", vals];
  const tree = pack({
    meta: { rows: ROWS.length, figures: ["params", "param_bytes", "buffer_bytes", "act_bytes", "act_saved_bytes", "grad_bytes", "opt_bytes", "flops_fwd", "flops_bwd", "ops_fwd", "ops_bwd", "unknown_flop_ops"], modules: MODULES.length },
    strings: { path: ROWS, name: ["Net", "blocks", "0-1 x2", "fc", "head", EVIL], class: ["Net", "ModuleList", "Block", "Linear", "Linear", "Evil"], color_device: ["cuda:0", "cpu", "no parameters"], color_dtype: ["float32", "no parameters"],
      ...(precision ? { precision: PRECISION, color_precision: ["mixed", "nf4 + LoRA bf16", "bf16", "no parameters"] } : {}) },
    arrays: {
      parent: ["i1", PARENT],
      depth: ["i1", [0, 1, 2, 3, 1, 1]],
      count: ["i1", [1, 1, 2, 2, 1, 1]],
      odd: { enc: "const", value: 0, length: 6 },
      tied: { enc: "const", value: 0, length: 6 },
      module_node: ["i1", MODULE_NODE],
      color_device: ["i1", [0, 0, 0, 0, 1, 2]],
      color_dtype: ["i1", [0, 0, 0, 0, 0, 1]],
      ...(precision ? { color_precision: ["i1", [0, 1, 1, 1, 2, 3]] } : {}),
      params: fig([300, 200, 200, 200, 100, 0]),
      param_bytes: fig([1200, 800, 800, 800, 400, 0]),
      buffer_bytes: fig([0, 0, 0, 0, 0, 0]),
      act_bytes: fig([96, 64, 64, 64, 16, 16]),
      act_saved_bytes: fig([64, 48, 48, 48, 16, 0]),
      grad_bytes: fig([1200, 800, 800, 800, 400, 0]),
      opt_bytes: fig([0, 0, 0, 0, 0, 0]),
      flops_fwd: fig([1000, 800, 800, 800, 200, 0]),
      flops_bwd: fig([2000, 1600, 1600, 1600, 400, 0]),
      ops_fwd: fig([6, 4, 4, 4, 1, 1]),
      ops_bwd: fig([4, 3, 3, 3, 1, 0]),
      unknown_flop_ops: fig([0, 0, 0, 0, 0, 0]),
    },
  });
  // cuda:0 memory after every op (12 points, no decimation needed)
  const param = [800, 1200, 1200, 1200, 1200, 1200, 1200, 1200, 1200, 1200, 1200, 1200];
  const act = [0, 0, 16, 32, 48, 64, 80, 96, 64, 32, 0, 0];
  const grad = [0, 0, 0, 0, 0, 0, 0, 0, 400, 800, 1200, 1200];
  const zero = { enc: "const", value: 0, length: n };
  const memArrays = {
    "phase_runs/phase": ["i1", [0, 1, 2]],
    "phase_runs/start": ["i1", [0, 2, 8]],
    "phase_runs/stop": ["i1", [2, 8, 12]],
    "cuda:0/seq": { enc: "range", start: 0, length: n },
    "cuda:0/Parameter": ["f8", param],
    "cuda:0/Buffer": zero,
    "cuda:0/Gradient": ["f8", grad],
    "cuda:0/Optimizer state": zero,
    "cuda:0/Activation": ["f8", act],
    "cuda:0/Temporary": zero,
    "cuda:0/Input": zero,
    "cuda:0/Other": zero,
    "cuda:0/allocated": ["f8", param.map((p, i) => p + act[i] + grad[i])],
    "cuda:0/reserved": ["f8", param.map(() => 4 << 20)],
    // alive at the peak (op 10): params of blocks (800) and head (400), their grads
    "cuda:0/attr_module": ["i1", [3, 5, 6, 3, 5, 6]],
    "cuda:0/attr_category": ["i1", [0, 0, 0, 2, 2, 2]],
    "cuda:0/attr_bytes": ["f8", [400, 400, 400, 400, 400, 400]],
  };
  const memory = pack({
    meta: { devices: [{ device: "cuda:0", points: n, allocator: true, peak_seq: 10 }], categories: CATEGORIES, phases: PHASES, n_ops: n, max_points: 4000 },
    arrays: memArrays,
  });
  const ops = pack({
    meta: { n_ops: n, start: 0, stop: n, truncated: false, phases: PHASES },
    strings: { ops: OP_NAMES, modules: MODULES, lines: ["train.py:10 in step", "/x/model.py:20 in forward"], shapes: ["8, 4", "8, 8"], dtypes: ["f32"], devices: ["cuda:0", "cpu"] },
    arrays: {
      seq: { enc: "range", start: 0, length: n },
      op: ["i1", OPS.op],
      module: ["i1", OPS.module],
      phase: ["i1", OPS.phase],
      device: { enc: "const", value: 0, length: n },
      line: ["i1", OPS.module.map((m) => (m < 0 ? 0 : 1))],
      shape: ["i1", OPS.op.map((o) => (o === 3 ? 0 : 1))],
      dtype: { enc: "const", value: 0, length: n },
      nbytes: { enc: "dict", index: ["u1", OPS.op.map((o) => (o === 0 ? 1 : 0))], values: [16, 400] },
      flops: ["f8", OPS.op.map((o) => (o === 1 ? 100 : o === 5 ? -1 : 0))],
    },
  });
  // alias graph: storage 0 <- tensor 1 (param Net.head.weight) <- view tensor 2; write on tensor 1
  const alias = pack({
    meta: { node_kinds: ["storage", "tensor", "name"], edge_kinds: ["storage", "view", "write", "name", "tied"], max_nodes: 200, total_nodes: 3, truncated: false, around: null },
    strings: { label: ["storage 0 (cuda:0, 400 B)", "$1: f32[10, 10]", "$2: f32[10, 10] = aten.t", "Net.head.weight", `Net.${EVIL}.weight`], names: ["Net.head.weight", "Net.head.weight", "", "Net.head.weight", ""], ops: OP_NAMES },
    arrays: {
      node_kind: ["i1", [0, 1, 1, 2, 2]],
      node_ref: ["i1", [0, 1, 2, 1, 1]],
      node_nbytes: ["f8", [400, 400, 400, 0, 0]],
      node_category: ["i1", [0, -1, -1, -1, -1]],
      node_writes: ["i1", [0, 1, 0, 0, 0]],
      node_module: ["i1", [6, 6, 6, 6, 7]],
      edge_src: ["i1", [1, 2, 1, 1, 3, 4]],
      edge_dst: ["i1", [0, 0, 2, 0, 1, 1]],
      edge_kind: ["i1", [0, 0, 1, 2, 4, 4]],
      edge_op: ["i1", [-1, -1, 2, 5, -1, -1]],
      edge_seq: ["i1", [-1, -1, 7, 9, -1, -1]],
    },
  });
  return {
    summary: {
      devices: ["cuda:0", "cpu"],
      categories: CATEGORIES,
      phases: PHASES,
      n_ops: n,
      capacity: 3000,
      capacity_spec: "3000",
      verdict: { fits: false, capacity: 3000, devices: { "cuda:0": { judged: 4 << 20, freed: false, peak: 4 << 20, allocated: 2400, raw: 2400, headroom: 3000 - (4 << 20), fits: false, oom_seq: -1, capacity: 3000, text: "cuda:0 peaks at 4.0 MiB reserved of 2.9 KiB, over by 4.0 MiB" } }, text: "does not fit 2.9 KiB: cuda:0 peaks at 4.0 MiB reserved of 2.9 KiB, over by 4.0 MiB" },
      peaks: {
        "cuda:0": { bytes: 2400, seq: 10, phase: "backward", op: "aten.add_", module: "Net.blocks.0.fc", user_line: "train.py:10 in step", by_category: { Parameter: 1200, Buffer: 0, Gradient: 1200, "Optimizer state": 0, Activation: 0, Temporary: 0, Input: 0, Other: 0 }, allocated: 2400, allocated_seq: 10, reserved: 4 << 20, reserved_seq: 0 },
      },
      error: null,
      palette: PALETTE,
    },
    tree: toDataView(tree),
    memory: toDataView(memory),
    ops: toDataView(ops),
    alias: toDataView(alias),
    time: toDataView(timePack()),
    selected_module: selected,
    device: "",
    phase: "",
    search: "",
    size_by: "param_bytes",
    x_axis: "op",
    gpu: "H100",
  };
}

/** A small alias pack: one storage and one tensor in it, both of module index `module`. */
export function aliasPack({ around = null, module = 1 } = {}) {
  return toDataView(
    pack({
      meta: { node_kinds: ["storage", "tensor", "name"], edge_kinds: ["storage", "view", "write", "name", "tied"], max_nodes: 200, total_nodes: 9, truncated: true, around },
      strings: { label: ["storage 3 (cuda:0, 64 B)", "$7: f32[4, 4] = aten.relu"], names: ["", ""], ops: OP_NAMES },
      arrays: {
        node_kind: ["i1", [0, 1]],
        node_ref: ["i1", [3, 7]],
        node_nbytes: ["f8", [64, 64]],
        node_category: ["i1", [5, -1]],
        node_writes: ["i1", [0, 0]],
        node_module: ["i1", [module, module]],
        edge_src: ["i1", [1]],
        edge_dst: ["i1", [0]],
        edge_kind: ["i1", [0]],
        edge_op: ["i1", [-1]],
        edge_seq: ["i1", [-1]],
      },
    }),
  );
}

/** A DataView at an odd offset of a larger buffer, as binary traits can arrive. */
export function toDataView(bytes) {
  const buf = new Uint8Array(bytes.length + 3);
  buf.set(bytes, 3);
  return new DataView(buf.buffer, 3, bytes.length);
}

/** A stand-in for anywidget's model: get/set/on/off/save_changes, recording what was saved. */
export function mockModel(initial) {
  const values = { ...initial };
  const handlers = new Map();
  const model = {
    saved: [],
    get: (k) => values[k],
    set(k, v) {
      values[k] = v;
      model.pending = { ...(model.pending || {}), [k]: v };
    },
    save_changes() {
      model.saved.push(model.pending || {});
      model.pending = null;
    },
    on(event, fn) {
      if (!handlers.has(event)) handlers.set(event, new Set());
      handlers.get(event).add(fn);
    },
    off(event, fn) {
      handlers.get(event)?.delete(fn);
    },
    /** what the kernel does: set a trait and fire change:<name> */
    kernelSet(k, v) {
      values[k] = v;
      for (const fn of handlers.get(`change:${k}`) || []) fn();
    },
    listenerCount: () => [...handlers.values()].reduce((a, s) => a + s.size, 0),
  };
  return model;
}
