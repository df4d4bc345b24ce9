// Reader of the FVPK packs that fakeviz/_views/explorer.py writes (the format is described there).
//
//   bytes 0..3 "FVPK", bytes 4..7 uint32 LE header length H, then H bytes of UTF-8 JSON
//   {v, meta, strings, arrays}, zero padding to a multiple of 8, then the data section.
//
// Arrays come back as typed arrays: raw ones in their own dtype, range/const/dict ones as
// Float64Array (Int32Array for ranges that fit), so every value is an exact JavaScript number.

export const MAGIC = "FVPK";
export const VERSION = 1;

const TYPED = {
  i1: Int8Array,
  u1: Uint8Array,
  i2: Int16Array,
  u2: Uint16Array,
  i4: Int32Array,
  u4: Uint32Array,
  f4: Float32Array,
  f8: Float64Array,
};
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** A Uint8Array view of what a binary trait arrives as (DataView, ArrayBuffer, typed array). */
export function asBytes(buf) {
  if (buf == null) return new Uint8Array(0);
  if (buf instanceof Uint8Array) return buf;
  if (ArrayBuffer.isView(buf)) return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  if (buf instanceof ArrayBuffer) return new Uint8Array(buf);
  if (Array.isArray(buf)) return Uint8Array.from(buf);
  throw new TypeError(`cannot read a pack from ${Object.prototype.toString.call(buf)}`);
}

/** Decode one pack: {meta, strings, arrays}; null for an empty buffer (a widget without data). */
export function unpack(buf) {
  const bytes = asBytes(buf);
  if (bytes.length === 0) return null;
  if (bytes.length < 8 || String.fromCharCode(...bytes.subarray(0, 4)) !== MAGIC) {
    throw new Error("not a fakeviz pack (bad magic)");
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const hlen = view.getUint32(4, true);
  if (8 + hlen > bytes.length) throw new Error("fakeviz pack: header runs past the end");
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + hlen)));
  if (header.v !== VERSION) throw new Error(`fakeviz pack version ${header.v}; this panel reads ${VERSION}`);
  const base = 8 + hlen + ((8 - ((8 + hlen) % 8)) % 8);
  const arrays = {};
  for (const [name, spec] of Object.entries(header.arrays || {})) {
    arrays[name] = decodeSpec(spec, bytes, base, name);
  }
  return { meta: header.meta || {}, strings: header.strings || {}, arrays };
}

function decodeSpec(spec, bytes, base, name) {
  switch (spec.enc) {
    case "raw":
      return readRaw(spec, bytes, base, name);
    case "range": {
      const { start, length } = spec;
      const fits = start >= -(2 ** 31) && start + length < 2 ** 31;
      const out = fits ? new Int32Array(length) : new Float64Array(length);
      for (let i = 0; i < length; i++) out[i] = start + i;
      return out;
    }
    case "const":
      return new Float64Array(spec.length).fill(spec.value);
    case "dict": {
      const index = readRaw(spec.index, bytes, base, name);
      const values = readRaw(spec.values, bytes, base, name);
      const out = new Float64Array(index.length);
      for (let i = 0; i < index.length; i++) out[i] = values[index[i]];
      return out;
    }
    default:
      throw new Error(`fakeviz pack: array ${name} has unknown encoding ${spec.enc}`);
  }
}

function readRaw(spec, bytes, base, name) {
  const T = TYPED[spec.dtype];
  if (!T) throw new Error(`fakeviz pack: array ${name} has unknown dtype ${spec.dtype}`);
  const start = base + spec.offset;
  const nbytes = spec.length * T.BYTES_PER_ELEMENT;
  if (start + nbytes > bytes.length) throw new Error(`fakeviz pack: array ${name} runs past the end`);
  if (!LITTLE_ENDIAN && T.BYTES_PER_ELEMENT > 1) return readSwapped(T, bytes, start, spec.length);
  const at = bytes.byteOffset + start;
  if (at % T.BYTES_PER_ELEMENT === 0) return new T(bytes.buffer, at, spec.length);
  return new T(bytes.slice(start, start + nbytes).buffer); // unaligned (a DataView into a message): copy
}

function readSwapped(T, bytes, start, length) {
  const view = new DataView(bytes.buffer, bytes.byteOffset + start, length * T.BYTES_PER_ELEMENT);
  const get = {
    2: T === Int16Array ? (o) => view.getInt16(o, true) : (o) => view.getUint16(o, true),
    4: T === Float32Array ? (o) => view.getFloat32(o, true) : T === Int32Array ? (o) => view.getInt32(o, true) : (o) => view.getUint32(o, true),
    8: (o) => view.getFloat64(o, true),
  }[T.BYTES_PER_ELEMENT];
  const out = new T(length);
  for (let i = 0; i < length; i++) out[i] = get(i * T.BYTES_PER_ELEMENT);
  return out;
}
