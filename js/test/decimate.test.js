import { describe, expect, it } from "vitest";
import { minmaxByColumn, minmaxIndices } from "../src/decimate.js";

function curve(n) {
  // a saw-tooth with one spike: the kind of shape a fwd+bwd memory curve has
  return Float64Array.from({ length: n }, (_, i) => (i % 97) * 10 + (i === 7777 ? 1e6 : 0));
}

describe("minmaxIndices", () => {
  it("keeps everything when short enough", () => {
    expect(Array.from(minmaxIndices([3, 1, 2], 10))).toEqual([0, 1, 2]);
  });

  it("is bounded, sorted, and keeps the peak and the ends", () => {
    const v = curve(23227);
    const idx = minmaxIndices(v, 4000, [123]);
    expect(idx.length).toBeLessThanOrEqual(4000);
    expect(idx[0]).toBe(0);
    expect(idx[idx.length - 1]).toBe(v.length - 1);
    expect(Array.from(idx)).toContain(7777);
    expect(Array.from(idx)).toContain(123);
    for (let i = 1; i < idx.length; i++) expect(idx[i]).toBeGreaterThan(idx[i - 1]);
    // the envelope survives: max and min of the kept points equal the full curve's
    const kept = Array.from(idx, (i) => v[i]);
    expect(Math.max(...kept)).toBe(Math.max(...v));
    expect(Math.min(...kept)).toBe(Math.min(...v));
  });

  it("takes the first row of a repeated maximum, as numpy.argmax does", () => {
    const v = [0, 5, 5, 1, 0, 5, 0, 0, 0, 0, 0, 0];
    const idx = Array.from(minmaxIndices(v, 6));
    expect(idx).toContain(1);
    expect(idx).not.toContain(2);
  });
});

describe("minmaxByColumn", () => {
  it("keeps at most two points per pixel column plus the ends", () => {
    const n = 5000;
    const xs = Float64Array.from({ length: n }, (_, i) => i * 3);
    const v = curve(n);
    const idx = minmaxByColumn(xs, v, 0, 3 * n, 100, [4321]);
    expect(idx.length).toBeLessThanOrEqual(2 * 100 + 3);
    expect(Array.from(idx)).toContain(4321);
    const kept = Array.from(idx, (i) => v[i]);
    expect(Math.max(...kept)).toBe(Math.max(...v));
  });
});
