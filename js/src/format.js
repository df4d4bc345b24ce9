// Number and text formatting for the panel (pure functions).

const BIN = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
const SI = ["", "k", "M", "G", "T", "P", "E"];

/**
 * Bytes in binary units, exactly as Python's fakeviz._core.fmt.format_bytes writes them: "512 B", "1.5 KiB",
 * "?" for a missing value (tests/views/test_figures.py runs both on the same values).
 */
export function fmtBytes(n) {
  if (n == null || Number.isNaN(Number(n))) return "?";
  let x = Number(n);
  for (let u = 0; u < BIN.length; u++) {
    if (Math.abs(x) < 1024 || u === BIN.length - 1) return u === 0 ? `${Math.trunc(x)} B` : `${fixed1(x)} ${BIN[u]}`;
    x /= 1024;
  }
  return `${n} B`; // unreachable: the last unit always returns
}

/** `x` with one decimal as Python's f"{x:.1f}": correctly rounded, a tie to the even digit (toFixed: away from 0). */
function fixed1(x) {
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const q = Math.abs(x) * 4;
  if (Number.isInteger(q) && q % 2 === 1) {
    // x = odd / 4 is the only exact tie at one decimal; |x| * 10 = odd * 2.5 is exact
    const lo = Math.floor(Math.abs(x) * 10);
    const tenths = lo % 2 === 0 ? lo : lo + 1;
    return `${x < 0 ? "-" : ""}${Math.floor(tenths / 10)}.${tenths % 10}`;
  }
  return x.toFixed(1);
}

/** A count with SI prefixes and three significant digits: "70.6 G", "512", "1.20 M". */
export function fmtSI(n, unit = "") {
  if (n == null || Number.isNaN(n)) return "–";
  let v = Number(n);
  const sign = v < 0 ? "-" : "";
  v = Math.abs(v);
  let u = 0;
  while (v >= 1000 && u < SI.length - 1) {
    v /= 1000;
    u++;
  }
  const digits = u === 0 ? (Number.isInteger(v) ? 0 : 2) : v >= 100 ? 0 : v >= 10 ? 1 : 2;
  const sep = SI[u] || unit ? " " : "";
  return `${sign}${v.toFixed(digits)}${sep}${SI[u]}${unit}`;
}

/** An integer with thousands separators. */
export function fmtInt(n) {
  if (n == null || Number.isNaN(n)) return "–";
  return Math.round(Number(n)).toLocaleString("en-US");
}

/** Seconds with three significant digits in s, ms or µs: "1.69 s", "512 ms", "12.3 µs", "0 s". */
export function fmtSeconds(t) {
  if (t == null || Number.isNaN(Number(t))) return "?";
  if (Number(t) === 0) return "0 s";
  const v = Number(Number(t).toPrecision(3)); // rounded first: 9.99999e-6 is "10.0 µs", 0.9996 is "1.00 s"
  const a = Math.abs(v);
  const [x, unit] = a >= 1 ? [v, "s"] : a >= 1e-3 ? [v * 1e3, "ms"] : [v * 1e6, "µs"];
  const m = Math.abs(x);
  return `${x.toFixed(m >= 100 ? 0 : m >= 10 ? 1 : 2)} ${unit}`;
}

/** FLOPs; a negative value means "no formula" in the trace. */
export function fmtFlops(n) {
  if (n == null || n < 0) return "?";
  return fmtSI(n, "FLOP");
}

/** The figures the tree can be sized by, with how each is totalled and printed. */
export const SIZE_BY = {
  param_bytes: { label: "parameter bytes", value: (f, i) => f.param_bytes[i], fmt: fmtBytes },
  act_bytes: { label: "activation bytes", value: (f, i) => f.act_bytes[i], fmt: fmtBytes },
  act_saved_bytes: { label: "saved activations", value: (f, i) => f.act_saved_bytes[i], fmt: fmtBytes },
  grad_bytes: { label: "gradient bytes", value: (f, i) => f.grad_bytes[i], fmt: fmtBytes },
  flops: { label: "FLOPs (fwd+bwd)", value: (f, i) => f.flops_fwd[i] + f.flops_bwd[i], fmt: (v) => fmtSI(v, "FLOP") },
  ops: { label: "ops (fwd+bwd)", value: (f, i) => f.ops_fwd[i] + f.ops_bwd[i], fmt: fmtInt },
  params: { label: "parameters", value: (f, i) => f.params[i], fmt: (v) => fmtSI(v) },
};

/** The last `keep` dotted components of a module path, with an ellipsis if cut. */
export function shortPath(path, keep = 3) {
  if (!path) return "";
  const parts = String(path).split(".");
  return parts.length <= keep ? String(path) : `…${parts.slice(-keep).join(".")}`;
}

/** "bf16[1, 2048, 8192]" from a dtype and a shape string as the trace stores them ("1, 2048, 8192"). */
export function fmtTensor(dtype, shape) {
  if (!dtype && !shape) return "";
  return `${dtype || "?"}[${shape ?? ""}]`;
}

/** Shorten a user line ("/long/path/to/file.py:12 in f") to "file.py:12 in f". */
export function shortLine(line) {
  if (!line) return "";
  const s = String(line);
  const cut = s.lastIndexOf("/", s.indexOf(":") >= 0 ? s.indexOf(":") : s.length);
  return cut >= 0 ? s.slice(cut + 1) : s;
}

/** The GPU capacity applies to the devices the verdict judges (Python leaves the host's out): else null. */
export function capacityOf(summary, device) {
  if (summary.capacity == null || !summary.verdict?.devices?.[device]) return null;
  return summary.capacity;
}

/**
 * `text` as a person should see it: each bidi control (marks, embeddings, overrides, isolates) and each C0/C1
 * control character written out as `<U+202E>`, so a name shows in logical order and cannot reorder the text
 * around it; ordinary letters of any script stay. With `lines`, line breaks and tabs are kept. The same as
 * `visible` in fakeviz/_core/fmt.py (Note: [bidi controls in names]); js/src/dom.js applies it to every text
 * and tooltip it sets, so the views need not.
 */
const HIDDEN = /[\x00-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]/g;
const HIDDEN_IN_LINES = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]/g;
export function visible(text, lines = false) {
  return String(text).replace(lines ? HIDDEN_IN_LINES : HIDDEN,
    (c) => `<U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}>`);
}

/** A name as `visible` writes it, keeping line breaks and tabs (`plain_name` in Python). */
export function plainName(name) {
  return visible(name, true);
}
