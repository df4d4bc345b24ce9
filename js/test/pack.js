// Test helper: write FVPK packs from JavaScript (the writer the panel uses is Python's
// fakeviz._views.explorer.pack; this one mirrors its format so tests can build small inputs).

const TYPED = { i1: Int8Array, u1: Uint8Array, i2: Int16Array, u2: Uint16Array, i4: Int32Array, u4: Uint32Array, f4: Float32Array, f8: Float64Array };

/** arrays: {name: [dtype, values] | {enc: "range"|"const"|"dict", ...}}; returns a Uint8Array. */
export function pack({ arrays = {}, strings = {}, meta = {} } = {}) {
  const chunks = [];
  let size = 0;
  const raw = (dtype, values) => {
    const pad = (8 - (size % 8)) % 8;
    if (pad) {
      chunks.push(new Uint8Array(pad));
      size += pad;
    }
    const T = TYPED[dtype];
    const typed = T.from(values);
    const spec = { enc: "raw", dtype, offset: size, length: typed.length };
    chunks.push(new Uint8Array(typed.buffer));
    size += typed.byteLength;
    return spec;
  };
  const specs = {};
  for (const [name, a] of Object.entries(arrays)) {
    if (Array.isArray(a)) specs[name] = raw(a[0], a[1]);
    else if (a.enc === "dict") specs[name] = { enc: "dict", index: raw(a.index[0], a.index[1]), values: raw("f8", a.values) };
    else specs[name] = a;
  }
  const header = new TextEncoder().encode(JSON.stringify({ v: 1, meta, strings, arrays: specs }));
  const headLen = 8 + header.length;
  const headPad = (8 - (headLen % 8)) % 8;
  const out = new Uint8Array(headLen + headPad + size);
  out.set([70, 86, 80, 75], 0); // "FVPK"
  new DataView(out.buffer).setUint32(4, header.length, true);
  out.set(header, 8);
  let at = headLen + headPad;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}
