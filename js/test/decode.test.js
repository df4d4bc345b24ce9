import { describe, expect, it } from "vitest";
import { asBytes, unpack } from "../src/decode.js";
import { pack } from "./pack.js";

describe("unpack", () => {
  const bytes = pack({
    meta: { rows: 3 },
    strings: { path: ["a", "a.b", "ünïcode"] },
    arrays: {
      i8: ["i1", [-1, 0, 127]],
      u16: ["u2", [0, 65535]],
      i32: ["i4", [-(2 ** 31), 2 ** 31 - 1]],
      f64: ["f8", [2 ** 53, 0.5, -3]],
      seq: { enc: "range", start: 5, length: 4 },
      zero: { enc: "const", value: 0, length: 3 },
      big: { enc: "dict", index: ["u1", [1, 0, 1, 1]], values: [282248397320, 512] },
    },
  });

  it("reads every encoding back", () => {
    const { meta, strings, arrays } = unpack(bytes);
    expect(meta).toEqual({ rows: 3 });
    expect(strings.path).toEqual(["a", "a.b", "ünïcode"]);
    expect(Array.from(arrays.i8)).toEqual([-1, 0, 127]);
    expect(arrays.u16).toBeInstanceOf(Uint16Array);
    expect(Array.from(arrays.u16)).toEqual([0, 65535]);
    expect(Array.from(arrays.i32)).toEqual([-(2 ** 31), 2 ** 31 - 1]);
    expect(Array.from(arrays.f64)).toEqual([2 ** 53, 0.5, -3]);
    expect(Array.from(arrays.seq)).toEqual([5, 6, 7, 8]);
    expect(Array.from(arrays.zero)).toEqual([0, 0, 0]);
    expect(Array.from(arrays.big)).toEqual([512, 282248397320, 512, 512]);
  });

  it("accepts a DataView at an unaligned offset, as a widget message delivers it", () => {
    const buf = new Uint8Array(bytes.length + 5);
    buf.set(bytes, 5);
    const { arrays } = unpack(new DataView(buf.buffer, 5, bytes.length));
    expect(Array.from(arrays.f64)).toEqual([2 ** 53, 0.5, -3]);
    expect(Array.from(arrays.i32)).toEqual([-(2 ** 31), 2 ** 31 - 1]);
  });

  it("accepts an ArrayBuffer and returns null for an empty trait", () => {
    expect(unpack(bytes.slice().buffer).meta.rows).toBe(3);
    expect(unpack(new DataView(new ArrayBuffer(0)))).toBeNull();
    expect(unpack(null)).toBeNull();
  });

  it("refuses what is not a pack", () => {
    expect(() => unpack(new TextEncoder().encode("PK\u0003\u0004 not a pack"))).toThrow(/bad magic/);
    const wrong = bytes.slice();
    const text = new TextDecoder().decode(wrong.subarray(8, 20));
    expect(text.startsWith('{"v":1')).toBe(true);
    wrong[13] = "7".charCodeAt(0); // {"v":7
    expect(() => unpack(wrong)).toThrow(/version 7/);
  });

  it("asBytes views typed arrays without copying", () => {
    const f = new Float64Array([1, 2]);
    const b = asBytes(f);
    expect(b.buffer).toBe(f.buffer);
    expect(b.length).toBe(16);
  });
});
